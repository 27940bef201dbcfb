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

import contextlib
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import socket
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.core.management.base import CommandError
from django.utils import timezone

from appliance.env import env_int
from inference import specsheet as sheet_
from inference.prompts import section_messages
from inference.specsheet import PROFILES, Sample, Targets
from inference.summarise import section_budget_tokens
from inference.timing import Delta
from measure.benchmarking import (
    Progress,
    check_migrated,
    ensure_embedded_broker,
    ensure_embedded_database,
    served_queues,
    start_appliance_processes,
    stop_groups,
    synthetic_rng,
    synthetic_sentence,
    wait_for_engine,
    wait_for_queues,
)

USERNAME = "specsheet"
DRAFTING_INSTRUCTION = "Draft a reply to this letter.\n\n"
QUEUES = {"ingest", "prefill", "decode"}
PROFILE_TEXT = {
    "document": ("Document", "long input, short output: a summary job on the prefill queue"),
    "drafting": ("Drafting", "short input, long output: a streamed chat completion on the decode queue"),
    "mixed": ("Mixed", "half the users summarise documents while the other half draft, at once"),
}


def add_arguments(parser) -> None:
    parser.add_argument("--quick", action="store_true", help="a smoke test for CI: short lengths, levels 1 and 2")
    parser.add_argument("--profiles", default=",".join(PROFILES), help="profiles to run, comma-separated")
    parser.add_argument("--levels", help="concurrency levels to run, e.g. 1,2,4 (default: a ladder that stops itself)")
    parser.add_argument("--max-concurrency", type=int, help="top of the ladder (default: the engine's max_num_seqs)")
    parser.add_argument("--requests-per-user", type=int, help="requests each user sends in turn (default 2, quick 1)")
    parser.add_argument("--document-input", type=int, help="document tokens in (default 8000, fit to the context)")
    parser.add_argument("--document-output", type=int, help="document tokens out (default 256)")
    parser.add_argument("--drafting-input", type=int, help="drafting tokens in (default 500)")
    parser.add_argument("--drafting-output", type=int, help="drafting tokens out (default 500)")
    parser.add_argument("--ttft-target-s", type=float, default=2.0, help="TTFT a request must meet (default 2 s)")
    parser.add_argument(
        "--itl-target-ms", type=float, default=100.0, help="mean ITL a request must meet (default 100 ms)"
    )
    parser.add_argument(
        "--min-goodput", type=float, default=0.9, help="share of requests meeting the target for a level to pass"
    )
    parser.add_argument(
        "--memory-bandwidth-gbs",
        type=float,
        help="device memory bandwidth, if known (default: measured or read from the GPU)",
    )
    parser.add_argument(
        "--max-minutes", type=float, help="stop climbing ladders after this long (default 90, quick 10)"
    )
    parser.add_argument("--request-timeout", type=float, default=900, help="seconds one request may take")
    parser.add_argument(
        "--url", help="the appliance to measure (default: the one `make run` serves, or one of its own)"
    )
    parser.add_argument("--seed", type=int, default=20261130)  # fmt: skip


def run(command, **options) -> dict[str, Any]:
    def write(line: str) -> None:
        command.stdout.write(line)
        command.stdout.flush()

    progress = Progress(write)
    plan = _Plan.from_options(options)
    for noisy in ("httpx", "matplotlib"):  # a line per request, a line per font
        logging.getLogger(noisy).setLevel(logging.WARNING)
    started_at = datetime.now(UTC)
    # Undone in reverse order, whatever fails or on Ctrl-C: the token revoked and the jobs
    # cancelled first, then the processes this command started stopped, then the services.
    with contextlib.ExitStack() as undo:
        for ensure in (ensure_embedded_database, ensure_embedded_broker):
            service = ensure(progress)
            if service:  # stopped again even if the next one fails to start
                undo.callback(_stop_service, service, progress)
        check_migrated(progress)
        appliance = _Appliance(progress, options["url"])
        undo.callback(appliance.close)
        url, engine = appliance.start()
        plan.start_clock()
        # Long enough for the last level begun within the time budget to finish.
        last_level_s = 600 + plan.requests_per_user * (options["request_timeout"] + 60)
        account = _Account.create(expires_at=timezone.now() + timedelta(seconds=plan.budget_s + last_level_s + 3600))
        undo.callback(account.close)
        client = _Client(url, account.token, timeout_s=options["request_timeout"])
        workload = _Workload(client, progress, plan, engine, seed=options["seed"])
        bandwidth = _memory_bandwidth(options["memory_bandwidth_gbs"], engine, progress)
        profiles = {name: workload.profile(name) for name in plan.profiles}
        try:
            engine = appliance.engine_stats()  # once more, after the run: its counters
        except Exception:  # noqa: BLE001 -- the start-up figures describe the same engine
            progress("the engine host did not answer after the run; the sheet uses its figures from the start")
        sheet = _assemble(plan=plan, engine=engine, profiles=profiles, bandwidth=bandwidth, started_at=started_at)
        paths = _write(sheet)
        write("")
        for item in sheet["answers"]:
            write(f"{item['question']}\n    {item['answer']}")
        write("")
        for path in paths:
            write(f"written: {path}")
        return sheet


def _stop_service(service, progress: Progress) -> None:
    progress("stopping the embedded service this command started")
    service.stop()


# --- what to run --------------------------------------------------------------------------------


class _Plan:
    def __init__(self, **values) -> None:
        self.__dict__.update(values)

    @classmethod
    def from_options(cls, options: dict) -> _Plan:
        quick = options["quick"]
        profiles = [p.strip() for p in options["profiles"].split(",") if p.strip()]
        if not profiles or any(p not in PROFILES for p in profiles):
            raise CommandError(f"--profiles: choose from {', '.join(PROFILES)}")
        levels = None
        if options["levels"]:
            try:
                levels = sorted({int(v) for v in options["levels"].split(",") if v.strip()})
            except ValueError:
                raise CommandError("--levels: whole numbers separated by commas, e.g. 1,2,4") from None
            if not levels or levels[0] < 1:
                raise CommandError("--levels: each level is at least 1")
        elif quick:
            levels = [1, 2]
        targets = Targets(
            ttft_ms=options["ttft_target_s"] * 1000, itl_ms=options["itl_target_ms"], min_goodput=options["min_goodput"]
        )
        if not 0 < targets.min_goodput <= 1 or targets.ttft_ms <= 0 or targets.itl_ms <= 0:
            raise CommandError("the targets must be positive and --min-goodput between 0 and 1")

        def positive(name: str, value):
            if value <= 0:
                raise CommandError(f"--{name.replace('_', '-')} must be more than 0")
            return value

        def tokens(name: str, default: int, quick_default: int) -> int:
            return positive(name, options[name] if options[name] is not None else (quick_default if quick else default))

        for name in ("request_timeout", "max_minutes", "memory_bandwidth_gbs"):
            if options[name] is not None:
                positive(name, options[name])

        return cls(
            quick=quick,
            profiles=profiles,
            levels=levels,
            max_concurrency=None
            if options["max_concurrency"] is None
            else positive("max_concurrency", options["max_concurrency"]),
            requests_per_user=positive(
                "requests_per_user",
                options["requests_per_user"] if options["requests_per_user"] is not None else (1 if quick else 2),
            ),
            document_input=tokens("document_input", 8000, 1024),
            document_output=min(tokens("document_output", 256, 32), settings.APPLIANCE_SUMMARY_MAX_TOKENS),
            drafting_input=tokens("drafting_input", 500, 128),
            drafting_output=tokens("drafting_output", 500, 64),
            targets=targets,
            budget_s=60 * (options["max_minutes"] or (10 if quick else 90)),
            deadline=None,
        )

    def start_clock(self) -> None:
        """The time budget counts from when the appliance answers (starting it is not measuring)."""
        self.deadline = time.monotonic() + self.budget_s


# --- the appliance: the running one, or processes of this command's own --------------------------


class _Appliance:
    def __init__(self, progress: Progress, url: str | None) -> None:
        self.progress = progress
        self.url = url.rstrip("/") if url else None
        self.started: list[subprocess.Popen] = []
        self.log_dir = Path(settings.VAR_DIR) / "specsheet" / "logs"

    def start(self) -> tuple[str, dict]:
        socket_path = Path(settings.APPLIANCE_ENGINE_SOCKET)
        url = self.url or f"http://127.0.0.1:{env_int('APPLIANCE_PORT', 8000, minimum=1, maximum=65535)}"
        if self.url or _answers(url):
            self.progress(f"measuring the appliance at {url}")
            if not set().union(*served_queues().values()) >= QUEUES:
                raise CommandError(f"The appliance at {url} has no workers on the queues {', '.join(sorted(QUEUES))}.")
            return url, wait_for_engine(socket_path, process=None, log_path=self.log_dir, timeout_s=60)
        if set().union(*served_queues().values()) & QUEUES or socket_path.exists() and _engine_answers(socket_path):
            raise CommandError(
                "Part of the appliance is running (workers or the engine host) but its web server does not answer "
                f"at {url}: stop it, start the whole appliance with `make run`, or pass --url."
            )
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        self.progress("starting an engine host, workers and a web server of this command's own (a minute or two)")
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE}
        self.started = start_appliance_processes(
            {"engine", "ingest-worker", "prefill-worker", "decode-worker", "web"},
            tag="specsheet", env=env, log_dir=self.log_dir, port=port,
        )  # fmt: skip
        engine = wait_for_engine(socket_path, process=self.started[0], log_path=self.log_dir / "engine.log")
        wait_for_queues(QUEUES, log_dir=self.log_dir)
        deadline = time.monotonic() + 60
        while not _answers(url):
            if time.monotonic() > deadline:
                raise CommandError(f"the web server did not answer at {url}; see {self.log_dir}")
            time.sleep(0.5)
        return url, engine

    def engine_stats(self) -> dict:
        from inference.engine.client import EngineClient

        return EngineClient(Path(settings.APPLIANCE_ENGINE_SOCKET), connect_timeout_s=5.0).stats()

    def close(self) -> None:
        if self.started:
            self.progress("stopping the processes this command started")
            stop_groups(self.started, timeout_s=60)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/accounts/login/", timeout=3).status_code == 200
    except httpx.HTTPError:
        return False


def _engine_answers(socket_path: Path) -> bool:
    from inference.engine.client import EngineClient, EngineUnavailable

    try:
        EngineClient(socket_path, connect_timeout_s=2.0).stats()
        return True
    except EngineUnavailable:
        return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- the account the requests come from ---------------------------------------------------------


class _Account:
    """A ``specsheet`` account that cannot sign in (no password), with an API token for this run
    only (it expires with the run). Afterwards the token is revoked, the account's documents and
    jobs are deleted and the account is switched off."""

    def __init__(self, user, token_row, token: str) -> None:
        self.user, self.token_row, self.token = user, token_row, token

    @classmethod
    def create(cls, *, expires_at: datetime) -> _Account:
        from api.services import token_create
        from measure.benchmarking import api_bench_user

        user = api_bench_user(USERNAME, deletes="documents and jobs")
        cls._clear(user)  # what a run that was killed left
        row, token = token_create(
            user=user,
            name="manage.py specsheet",
            scopes=["read", "write"],
            expires_at=expires_at,
            rate_limit_per_minute=100_000,  # the run's own polling and streams, not a person's
            max_streams=100_000,
        )
        return cls(user, row, token)

    @staticmethod
    def _clear(user) -> None:
        from api.models import ApiToken
        from api.services import token_revoke
        from documents.models import Document
        from inference.models import Job
        from inference.services import job_cancel

        for token in ApiToken.objects.filter(user=user, revoked_at__isnull=True):
            token_revoke(token=token)
        for job in Job.objects.filter(owner=user).exclude(state__in=Job.FINISHED_STATES):
            job_cancel(job=job)  # a worker still writing stops at its next batch
        Job.objects.filter(owner=user).delete()
        for document in Document.objects.filter(owner=user):
            document.delete()

    def close(self) -> None:
        self._clear(self.user)
        self.user.is_active = False
        self.user.save(update_fields=["is_active"])


# --- HTTP -----------------------------------------------------------------------------------


class _TimedOut(Exception):
    pass


class _Client:
    def __init__(self, url: str, token: str, *, timeout_s: float) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {token}"}
        self.timeout_s = timeout_s

    def _http(self):
        # A read timeout alone would never fire: a waiting job's stream sends something every few
        # seconds. Each request also has a deadline (``_lines``).
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=httpx.Timeout(60, connect=10))

    def model_id(self) -> str:
        with self._http() as http:
            response = http.get("/v1/models")
        _check(response, "GET /v1/models")
        return response.json()["data"][0]["id"]

    def upload(self, name: str, text: str) -> int:
        with self._http() as http:
            response = http.post("/api/v1/documents", files={"file": (name, text.encode(), "text/plain")})
        _check(response, "POST /api/v1/documents")
        return int(response.json()["id"])

    def document_states(self, ids: list[int]) -> dict[int, tuple[str, str]]:
        states = {}
        with self._http() as http:
            for document_id in ids:
                response = http.get(f"/api/v1/documents/{document_id}")
                _check(response, "GET /api/v1/documents/{id}")
                body = response.json()
                states[document_id] = (body["state"], body.get("error") or "")
        return states

    def _lines(self, stream, deadline: float):
        for line in stream.iter_lines():
            yield line
            if time.monotonic() > deadline:
                raise _TimedOut

    def _cancel(self, http, job_id: str | None) -> None:
        if job_id:
            with contextlib.suppress(httpx.HTTPError):  # the account's clean-up cancels it otherwise
                http.post(f"/api/v1/jobs/{job_id}/cancel")

    def summary(self, sample: Sample, *, document_id: int, max_tokens: int) -> None:
        """A summary job, then its stream: each ``delta`` carries its tokens' times at the worker."""
        deadline = time.monotonic() + self.timeout_s
        job_id = None
        with self._http() as http:
            try:
                response = http.post(
                    "/api/v1/jobs/summary",
                    json={"document_id": document_id, "length": "short", "max_tokens": max_tokens, "ignore_eos": True},
                )
                _check(response, "POST /api/v1/jobs/summary")
                job_id = response.json()["id"]
                with http.stream("GET", f"/api/v1/jobs/{job_id}/stream") as stream:
                    event = ""
                    for line in self._lines(stream, deadline):
                        if line.startswith("event: "):
                            event = line[7:]
                            continue
                        if not line.startswith("data: "):
                            continue
                        if event == "delta":
                            _add_tokens(sample, json.loads(line[6:]), time.time())
                        elif event == "restart":
                            _restarted(sample)
                        elif event in ("failed", "cancelled"):
                            detail = json.loads(line[6:]).get("detail") or "no reason given"
                            sample.error = f"the job {event}: {detail}"
                            return
                        elif event == "done":
                            sample.finished_at = time.time()
                            return
                sample.error = "the stream ended before the job did"
            except (_TimedOut, httpx.HTTPError) as exc:
                sample.error = _lost(exc, self.timeout_s)
                self._cancel(http, job_id)

    def chat(self, sample: Sample, *, model: str, prompt: str, max_tokens: int) -> None:
        """A streamed chat completion; with ``continuous_usage_stats`` each chunk carries the usage
        so far and its tokens' times at the worker."""
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        deadline = time.monotonic() + self.timeout_s
        written = 0
        with self._http() as http, http.stream("POST", "/v1/chat/completions", json=body) as stream:
            if stream.status_code != 200:
                stream.read()
                _check(stream, "POST /v1/chat/completions")
            try:
                for line in self._lines(stream, deadline):
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        sample.finished_at = time.time()
                        return
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        sample.error = str(chunk["error"].get("message") or chunk["error"])
                        return
                    written = _chat_chunk(sample, chunk, written, time.time())
                sample.error = "the stream ended without [DONE]"
            except (_TimedOut, httpx.HTTPError) as exc:
                sample.error = _lost(exc, self.timeout_s)
                self._cancel(http, stream.headers.get("X-Appliance-Job-Id"))


def _lost(exc: Exception, timeout_s: float) -> str:
    """Why a request's stream was given up (its job is cancelled)."""
    if isinstance(exc, _TimedOut):
        return f"no answer within {timeout_s:.0f} s (--request-timeout); its job was cancelled"
    return f"the stream broke ({type(exc).__name__}: {exc}); its job was cancelled"


def _add_tokens(sample: Sample, data: dict, arrived: float) -> None:
    """A delta of a stream: its tokens at the times the worker received them."""
    times = [Delta(at=float(at), tokens=int(n)) for at, n in data.get("times") or () if int(n) > 0]
    if not times and int(data.get("tokens") or 0) > 0:  # a stream that does not say: the client's clock
        times = [Delta(at=arrived, tokens=int(data["tokens"]))]
    if times and sample.first_token_at is None:
        sample.first_token_at = arrived
    sample.deltas.extend(times)
    sample.prompt_tokens = data.get("prompt_tokens") or sample.prompt_tokens


def _chat_chunk(sample: Sample, chunk: dict, written: int, arrived: float) -> int:
    """A chat completion chunk with ``continuous_usage_stats``: its tokens go to ``sample``.
    Returns the tokens written so far."""
    usage = chunk.get("usage") or {}
    if not chunk.get("choices") or usage.get("completion_tokens") is None:
        return written
    times = (chunk.get("appliance") or {}).get("token_times")
    new = sum(n for _, n in times) if times is not None else usage["completion_tokens"] - written
    # The appliance started the request again: its count starts anew, and chunks resume once the
    # new attempt has caught up with the text already sent, carrying all of its tokens' times.
    if times is not None and usage["completion_tokens"] != written + new:
        _restarted(sample)
    _add_tokens(sample, {"tokens": new, "times": times or (), "prompt_tokens": usage.get("prompt_tokens")}, arrived)
    return usage["completion_tokens"]


def _restarted(sample: Sample) -> None:
    """The appliance lost the worker or the engine and runs the request again from the start: its
    tokens are counted anew (the first token the user saw stays the first)."""
    sample.restarts += 1
    sample.deltas.clear()


def _check(response, what: str) -> None:
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text[:200]
        raise CommandError(f"{what} answered {response.status_code}: {detail}")


# --- the workload -------------------------------------------------------------------------------


class _Workload:
    def __init__(self, client: _Client, progress: Progress, plan: _Plan, engine: dict, *, seed: int) -> None:
        from transformers import AutoTokenizer

        self.client, self.progress, self.plan, self.engine = client, progress, plan, engine
        self.rng = synthetic_rng(seed)
        self.tokenizer = AutoTokenizer.from_pretrained(engine.get("model_path") or settings.APPLIANCE_MODEL)
        self.model = client.model_id()
        self.counter = 0
        # What the chat template and the instruction add around a drafting request's letter, so
        # that the whole prompt has the input length asked for.
        self.drafting_overhead = max(
            0, self._prompt_tokens([{"role": "user", "content": f"{DRAFTING_INSTRUCTION}x"}]) - 1
        )
        context = int(engine["max_model_len"])
        # A document must be one summary request (a longer one is summarised part by part, and
        # its TTFT would be the last part's): at most what a section of the context holds, and its
        # text cut as the appliance will cut it (pages, page marks, title) must make one section.
        try:
            self.document_input = min(plan.document_input, section_budget_tokens(context))
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        self.document_text_tokens = self._one_section_tokens(context)
        self.drafting_input = min(plan.drafting_input, context - plan.drafting_output - 64)
        if self.drafting_input < 1:
            raise CommandError(f"--drafting-output {plan.drafting_output} leaves no room in a {context}-token context")
        # The engine host's admission budget; documents may not use the share kept for drafting.
        budget = engine.get("kv_budget_tokens") or int(
            engine["kv_capacity_tokens"] * float(engine.get("kv_safety_factor", 1.0))
        )
        reserve = engine.get("kv_decode_reserve_tokens")
        if reserve is None:
            reserve = int(budget * float(engine.get("kv_decode_reserve_fraction", 0.0)))
        self.kv_budget, self.kv_decode_reserve = int(budget), int(reserve)

    # text

    def _one_section_tokens(self, context: int) -> int:
        """Tokens of document text that the appliance summarises in one request: the most, up to
        ``document_input`` in all, whose pages the appliance's own ``split_sections`` keeps in one
        section (a little less for the next document's other sentences)."""
        from documents.extraction import paginate
        from inference.prompts import PageText
        from inference.summarise import split_sections

        def count_many(prompts: list) -> list[int]:
            return [self._prompt_tokens(messages) for messages in prompts]

        tokens = self.document_input
        for _ in range(12):
            text = self._text(tokens)
            pages = [PageText(i + 1, page) for i, page in enumerate(paginate(text))]
            sections = split_sections(title="specsheet-0", pages=pages, context_tokens=context, count_many=count_many)
            if len(sections) == 1:
                whole = count_many([section_messages(title="specsheet-0", pages=pages, instruction="")])[0]
                if whole <= self.document_input:
                    return int(tokens * 0.98)
            tokens = int(tokens * 0.95)
        raise CommandError(f"no document fits one summary request in a {context}-token context")

    def _prompt_tokens(self, messages: list[dict]) -> int:
        """Tokens of a chat prompt as the engine host counts them: the chat template, then the text."""
        return self._count(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))

    def _count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def _text(self, tokens: int) -> str:
        """New contract-like text of ``tokens`` tokens, give or take half a sentence, with a unique
        opening line, so that no two requests share a prefix in the cache."""
        self.counter += 1
        sentences = [f"Agreement {self.counter}-{self.rng.randrange(10**9)}."]
        count = self._count(sentences[0])
        while count < tokens:
            sentence = synthetic_sentence(self.rng)
            count += self._count(" " + sentence)
            sentences.append(sentence)
        text, shorter = " ".join(sentences), " ".join(sentences[:-1])
        if len(sentences) > 1 and abs(self._count(shorter) - tokens) < abs(self._count(text) - tokens):
            return shorter
        return text

    def _documents(self, n: int) -> list[int]:
        """``n`` new documents uploaded through the API, once they are ready to summarise."""
        if n == 0:
            return []
        self.progress(f"uploading {n} document(s) of {self.document_text_tokens:,} tokens of text")
        ids = [
            self.client.upload(f"specsheet-{self.counter + 1}.txt", self._text(self.document_text_tokens))
            for _ in range(n)
        ]
        deadline = time.monotonic() + 600
        while True:
            states = self.client.document_states(ids)
            failed = {i: error for i, (state, error) in states.items() if state == "failed"}
            if failed:
                raise CommandError(f"a document failed to ingest: {next(iter(failed.values()))}")
            if all(state == "ready" for state, _ in states.values()):
                return ids
            if time.monotonic() > deadline:
                raise CommandError("documents were not ready after 10 minutes; is the ingest worker running?")
            time.sleep(0.5)

    # one profile

    def _levels(self) -> list[int]:
        if self.plan.levels:
            return self.plan.levels
        top = self.plan.max_concurrency or int(self.engine.get("max_num_seqs") or settings.APPLIANCE_MAX_NUM_SEQS)
        return sheet_.ladder(top)

    def _kinds(self, name: str, users: int) -> list[str]:
        if name == "mixed":
            return ["document" if i % 2 else "drafting" for i in range(users)]
        return [name] * users

    def _kv_shortfall(self, kinds: list[str]) -> str | None:
        return sheet_.kv_shortfall(
            requests={kind: kinds.count(kind) for kind in set(kinds)},
            tokens_per_request={
                "document": self.document_input + self.plan.document_output,
                "drafting": self.drafting_input + self.plan.drafting_output,
            },
            in_flight_cap={
                "document": settings.APPLIANCE_PREFILL_CONCURRENCY,
                "drafting": settings.APPLIANCE_DECODE_CONCURRENCY,
            },
            budget_tokens=self.kv_budget,
            document_budget_tokens=self.kv_budget - self.kv_decode_reserve,
        )

    def profile(self, name: str) -> dict[str, Any]:
        label, description = PROFILE_TEXT[name]
        levels = [level for level in self._levels() if name != "mixed" or level >= 2]
        rows: list[dict[str, Any]] = []
        stopped = error = ""
        explicit = bool(self.plan.levels)
        for users in levels:
            kinds = self._kinds(name, users)
            shortfall = self._kv_shortfall(kinds)
            if shortfall and not explicit:
                stopped = f"the KV budget at {sheet_._users(users)}: {shortfall}"
                break
            if time.monotonic() > self.plan.deadline:
                stopped = "the time budget (--max-minutes) ran out"
                break
            try:
                row = self._level(name, kinds)
            except CommandError as exc:  # the appliance refused to set the level up: say so, go on
                error = str(exc)
                stopped = f"an error at {sheet_._users(users)}: {exc}"
                self.progress(f"{label.lower()} x {users}: {exc}")
                break
            rows.append(row)
            self.progress(f"{label.lower()} x {users}: {_level_line(row)}")
            if not row["meets_target"] and not explicit:
                stopped = (
                    f"the latency target: goodput {row['goodput']:.0%} < {self.plan.targets.min_goodput:.0%} "
                    f"at {sheet_._users(users)}"
                )
                break
        else:
            ran = ", ".join(str(level) for level in levels)
            stopped = f"the top of the ladder ({ran})" if not explicit else f"running only the levels asked for ({ran})"
        inputs = {"document": self.document_input, "drafting": self.drafting_input}
        outputs = {"document": self.plan.document_output, "drafting": self.plan.drafting_output}
        kinds = ["document", "drafting"] if name == "mixed" else [name]
        return {
            "label": label,
            "description": description,
            "queue": {"document": "prefill", "drafting": "decode", "mixed": "prefill + decode"}[name],
            # The mixed profile has two kinds of request: see ``inputs`` and ``outputs``.
            "input_tokens": inputs[name] if name != "mixed" else None,
            "output_tokens": outputs[name] if name != "mixed" else None,
            "inputs": {k: inputs[k] for k in kinds},
            "outputs": {k: outputs[k] for k in kinds},
            "requests_per_user": self.plan.requests_per_user,
            "levels": rows,
            "users_served": sheet_.users_served(rows),
            "stopped": stopped,
            "error": error,
        }

    def _level(self, name: str, kinds: list[str]) -> dict[str, Any]:
        per_user = self.plan.requests_per_user
        documents = iter(self._documents(kinds.count("document") * per_user))
        prompts = {
            i: [
                f"{DRAFTING_INSTRUCTION}{self._text(max(1, self.drafting_input - self.drafting_overhead))}"
                for _ in range(per_user)
            ]
            for i, kind in enumerate(kinds)
            if kind == "drafting"
        }
        work = {
            i: [next(documents) for _ in range(per_user)] if kind == "document" else prompts[i]
            for i, kind in enumerate(kinds)
        }
        samples: list[Sample] = []
        lock = threading.Lock()
        gate = threading.Barrier(len(kinds))

        def user(i: int) -> None:
            gate.wait()
            for item in work[i]:
                sample = Sample(kind=kinds[i], sent_at=time.time())
                try:
                    if kinds[i] == "document":
                        self.client.summary(sample, document_id=item, max_tokens=self.plan.document_output)
                    else:
                        self.client.chat(sample, model=self.model, prompt=item, max_tokens=self.plan.drafting_output)
                except Exception as exc:  # noqa: BLE001 -- a failed request is a figure of the sheet
                    sample.error = sample.error or f"{type(exc).__name__}: {exc}"
                with lock:
                    samples.append(sample)

        # Daemon threads, joined with a timeout: Ctrl-C reaches this thread, and the command's
        # clean-up cancels what they asked for.
        threads = [
            threading.Thread(target=user, args=(i,), name=f"specsheet-user-{i}", daemon=True) for i in range(len(kinds))
        ]
        started = time.time()
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.5)
        wall = max((s.finished_at or time.time()) for s in samples) - started
        row = sheet_.summarise_level(samples, concurrency=len(kinds), wall_s=wall, targets=self.plan.targets)
        if name == "mixed":
            row["by_kind"] = {
                kind: sheet_.summarise_level(
                    [s for s in samples if s.kind == kind],
                    concurrency=kinds.count(kind),
                    wall_s=wall,
                    targets=self.plan.targets,
                )
                for kind in ("document", "drafting")
            }
        return row


def _level_line(row: dict) -> str:
    return (
        f"TTFT p50 {sheet_._seconds(row['ttft_p50_ms'])} p95 {sheet_._seconds(row['ttft_p95_ms'])}, "
        f"ITL p50 {row['itl_p50_ms']} ms p95 {row['itl_p95_ms']} ms, "
        f"{row['tokens_per_s_per_user']} tokens/s per user, {row['aggregate_tokens_per_s']} aggregate, "
        f"goodput {row['goodput']:.0%}" + (f", {row['failed']} failed" if row["failed"] else "")
    )


# --- hardware and the decode ceiling ------------------------------------------------------------


def _nvidia_smi(fields: str) -> list[str] | None:
    binary = shutil.which("nvidia-smi")
    if not binary:
        return None
    try:
        out = subprocess.run(
            [binary, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.strip().splitlines()[:1]
    return [v.strip() for v in first[0].split(",")] if first else None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    for name in (package, f"{package}-cpu"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def hardware(engine: dict) -> dict[str, Any]:
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    gpu = engine.get("device") == "cuda"
    smi = _nvidia_smi("driver_version") if gpu else None
    return {
        "device": engine.get("device") or "cpu",
        "device_name": engine.get("device_name") if gpu else f"CPU ({_cpu_name()})",
        "device_count": engine.get("device_count") or 1,
        # A CPU engine's device is the machine's memory, of which the KV cache has its configured share.
        "device_memory_bytes": engine.get("device_memory_bytes") if gpu else ram,
        "cpu": _cpu_name(),
        "cpus": os.cpu_count(),
        "ram_bytes": ram,
        "driver": smi[0] if smi else None,
        "cuda": engine.get("driver") if gpu else None,
        "vllm": engine.get("vllm_version") or _version("vllm"),
        "torch": engine.get("torch_version") or _version("torch"),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def _memory_bandwidth(given_gbs: float | None, engine: dict, progress: Progress) -> tuple[float | None, str]:
    """Bytes per second the device's memory delivers, and where the figure comes from."""
    if given_gbs:
        return given_gbs * 1e9, "given with --memory-bandwidth-gbs"
    if engine.get("device") == "cuda":
        # The engine holds the GPU; its theoretical peak from NVML (memory clock x bus width, two
        # transfers a clock) rather than a copy that would need memory the engine has taken.
        try:
            import pynvml

            pynvml.nvmlInit()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else 0)
            clock_mhz = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)
            bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(handle)
            return clock_mhz * 1e6 * 2 * bus_bits / 8, f"NVML: {clock_mhz} MHz x {bus_bits} bits x 2 (theoretical peak)"
        except Exception:  # noqa: BLE001 -- no NVML: say so on the sheet
            return None, "unknown (no NVML; pass --memory-bandwidth-gbs)"
    import torch

    # 1 GiB: far larger than any CPU's caches, so the copy measures the memory.
    progress("measuring the memory bandwidth (copies of 1 GiB)")
    size = 1024**3
    source = torch.empty(size, dtype=torch.uint8)
    source.fill_(1)
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - started)
    return 2 * size / best, "measured: the best of 5 copies of 1 GiB (read + write)"


# --- the sheet ----------------------------------------------------------------------------------


def _assemble(*, plan: _Plan, engine: dict, profiles: dict, bandwidth: tuple, started_at: datetime) -> dict[str, Any]:
    from inference.capacity import shape_of_model_dir

    finished_at = datetime.now(UTC)
    model_dir = Path(engine.get("model_path") or settings.APPLIANCE_MODEL)
    sheet: dict[str, Any] = {
        "version": sheet_.SHEET_VERSION,
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": finished_at.isoformat(timespec="seconds"),
        "duration_s": round((finished_at - started_at).total_seconds(), 1),
        "quick": plan.quick,
        "targets": {
            "ttft_ms": plan.targets.ttft_ms,
            "itl_ms": plan.targets.itl_ms,
            "min_goodput": plan.targets.min_goodput,
        },
        "model": {
            "name": engine.get("model") or model_dir.name,
            "licence": engine.get("licence") or settings.APPLIANCE_MODEL_LICENCE,
        },
        "engine": {
            key: engine.get(key)
            for key in (
                "dtype",
                "kv_cache_dtype",
                "max_model_len",
                "kv_capacity_tokens",
                "kv_block_size",
                "max_num_seqs",
                "max_num_batched_tokens",
                "scheduling",
                "vllm_version",
                "torch_version",
            )
        },  # fmt: skip
        "appliance": {
            "prefill_concurrency": settings.APPLIANCE_PREFILL_CONCURRENCY,
            "decode_concurrency": settings.APPLIANCE_DECODE_CONCURRENCY,
            "kv_safety_factor": engine.get("kv_safety_factor"),
            "kv_decode_reserve": engine.get("kv_decode_reserve_fraction"),
        },
        "hardware": hardware(engine),
        "profiles": profiles,
    }
    drafting = profiles.get("drafting") or profiles.get("mixed")
    single = sheet_.level_at(profiles["drafting"]["levels"], 1) if "drafting" in profiles else None
    try:
        # The precisions the engine runs at (weights loaded as, KV cache stored as), not the config's.
        shape = shape_of_model_dir(
            model_dir,
            weight_dtype=engine.get("dtype") or None,
            kv_dtype=engine.get("kv_cache_dtype") or settings.APPLIANCE_KV_CACHE_DTYPE,
        )
        context = drafting["inputs"].get("drafting", 0) + drafting["outputs"].get("drafting", 0) // 2 if drafting else 0
        sheet["decode_ceiling"] = {
            **sheet_.decode_ceiling(
                bandwidth_bytes_per_s=bandwidth[0],
                weight_bytes=shape.weight_bytes,
                kv_bytes_per_token=shape.kv_bytes_per_token,
                context_tokens=context,
                measured_tokens_per_s=single["tokens_per_s_per_user"] if single else None,
            ),
            "bandwidth_source": bandwidth[1],
        }
    except (OSError, ValueError, KeyError):
        sheet["decode_ceiling"] = None
    sheet["answers"] = sheet_.answers(sheet)
    return sheet


def _write(sheet: dict[str, Any]) -> list[Path]:
    out = Path(settings.VAR_DIR) / "specsheet"
    out.mkdir(parents=True, exist_ok=True)
    stem = f"specsheet-{datetime.fromisoformat(sheet['started_at']).strftime('%Y%m%dT%H%M%SZ')}"
    ttft, tokens = out / f"{stem}-ttft.png", out / f"{stem}-tokens-per-s.png"
    sheet["charts"] = {"ttft": ttft.name, "tokens_per_s": tokens.name}
    sheet["files"] = {"json": f"{stem}.json", "markdown": f"{stem}.md"}
    sheet_.draw_charts(sheet, ttft_path=ttft, tokens_path=tokens)
    (out / f"{stem}.md").write_text(sheet_.markdown(sheet), encoding="utf-8")
    body = json.dumps(sheet, indent=2) + "\n"
    (out / f"{stem}.json").write_text(body, encoding="utf-8")
    latest = out / "latest.json.tmp"
    latest.write_text(body, encoding="utf-8")
    latest.replace(out / "latest.json")  # the console and the API never read half a sheet
    return [out / f"{stem}.json", out / f"{stem}.md", ttft, tokens, out / "latest.json"]
