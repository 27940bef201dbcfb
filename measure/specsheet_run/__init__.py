"""``manage.py specsheet``: the appliance measures itself and answers the eight questions a buyer
should ask (which model and licence, precision of weights and KV cache, context length, how many
concurrent users, with what input and output lengths, at how many tokens/s per user, at what time
to first token, on what hardware).

Every request goes through the real path, as an internal tool's would: the appliance's HTTP API
(a personal API token of a ``specsheet`` account), its Celery queues and workers, its engine host
and model. Three workload profiles:

- *document*: long input, short output (8,000 tokens in / 256 out, scaled down to fit the
  model's context): a summary job (``POST /api/v1/jobs/summary`` with ``max_tokens`` and
  ``ignore_eos``) on a document uploaded through ``POST /api/v1/documents``, on the prefill queue;
- *drafting*: short in, long out (500 / 500): ``POST /v1/chat/completions``, streamed, on the
  decode queue, where drafts and chat run;
- *mixed*: half the users do one, half the other, at once.

Each profile climbs a ladder of concurrent users (1, 2, 4, ... up to the engine's
``max_num_seqs``); each user sends ``--requests-per-user`` requests one after another. A profile
stops at the first level that misses the target, or before a level whose KV demand (users x
(input + output)) the admission budget cannot hold, or when ``--max-minutes`` is spent. Every
document and prompt is new text, so no request finds another's in the prefix cache.

It uses the running appliance (``make run``, or ``--url``) or, when none answers, starts an engine
host, workers and a web server of its own and stops them afterwards. The sheet is written under
``var/specsheet/`` as JSON, Markdown and two PNG charts, and copied to ``latest.json``, which the
console (``/console/specsheet``) and the API (``GET /api/v1/engine``) show. The same command on a
GPU box with another model (``APPLIANCE_MODEL``) gives that box's figures.
"""

from __future__ import annotations

from measure.specsheet_run.runner import add_arguments, run

__all__ = ["add_arguments", "run"]
