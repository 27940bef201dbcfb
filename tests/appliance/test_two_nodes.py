"""Two nodes on loopback, as a small cluster runs: one Postgres, one broker, one web process.

- Node A is the test session's own: its engine host and its prefill and decode workers (the
  session's), announced in the cluster view by this test as ``manage.py serve`` would.
- Node B is started here as a GPU node is: ``manage.py serve --roles engine,prefill,decode``
  with a name of its own, its own engine host (its own socket and token) and its own workers.

Jobs spread over both; a document's clause extraction after its summary goes to the engine that
ran the summary and reads its prompt from that engine's prefix cache; node B killed (engine host,
engine core and workers at once) while it runs a job: the job is handed on and finished on node
A, and the web process's cluster view shows node B down.
"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.test import Client

from appliance.cluster import NODES_KEY, Announcer, nodes
from appliance.processes import kill_tree, start
from inference import lifecycle, services, streaming
from inference.engine.client import EngineClient
from inference.models import Job
from tests.conftest import BASE_DIR, _child_env, _test_database_url, wait_until
from tests.factories import ready_document

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

LICENCES = Path("/usr/share/common-licenses")
NODE_B = "node-b"


def _node_b_engine(var_dir: Path) -> str:
    return f"{NODE_B}/unix:{var_dir / 'run' / 'engine.sock'}"


@pytest.fixture
def node_a(engine_host, workers):
    """The session's engine and workers, announced as a node under the name their workers use."""
    client = streaming.sync_client()
    announcer = Announcer(["engine", "prefill", "decode"], interval_s=1.0)
    announcer.start()
    try:
        yield lifecycle.this_engine(EngineClient.from_settings())
    finally:
        announcer.stop()
        client.hdel(NODES_KEY, settings.APPLIANCE_NODE_NAME)


@pytest.fixture
def node_b(tmp_path, node_a):
    """A second node: ``manage.py serve --roles engine,prefill,decode`` on this machine."""
    var_dir = tmp_path / "node-b"
    log = var_dir / "serve.log"
    env = _child_env(
        DATABASE_URL=_test_database_url(), REDIS_URL=settings.REDIS_URL, APPLIANCE_VAR_DIR=str(var_dir),
        APPLIANCE_NODE_NAME=NODE_B, APPLIANCE_NODE_HEARTBEAT_S="1",
        APPLIANCE_PREFILL_CONCURRENCY="1", APPLIANCE_DECODE_CONCURRENCY="2",
    )  # fmt: skip
    env.pop("APPLIANCE_ENGINE_TOKEN", None)  # its own engine host, with a token of its own
    env.pop("APPLIANCE_ENGINE_SOCKET", None)
    process = start([sys.executable, "manage.py", "serve", "--roles", "engine,prefill,decode"], cwd=BASE_DIR, env=env,
                    log_path=log, fresh_log=True, tie_to_parent=True)  # fmt: skip

    def ready():
        if process.poll() is not None:
            pytest.fail(f"node B's serve exited ({process.returncode}):\n{log.read_text(errors='replace')[-4000:]}")
        node = next((n for n in nodes() if n["name"] == NODE_B), None)
        return node is not None and node["up"] and node["engine"]["state"] == "ready"

    try:
        wait_until(ready, timeout_s=600, interval_s=1.0, message="node B's engine")
        yield SimpleNamespace(engine=_node_b_engine(var_dir), process=process)
    finally:
        kill_tree(process.pid)
        streaming.sync_client().hdel(NODES_KEY, NODE_B)


def _finished(job_id):
    job = Job.objects.select_related("metrics").get(pk=job_id)
    return job if job.is_finished else None


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def _console_nodes(client) -> dict[str, str]:
    """The console overview's Nodes table: each node's row, as text."""
    page = client.get("/console/").content.decode()
    table = page[page.index('id="console-nodes"') :]
    table = table[: table.index("</table>")]
    rows = [re.sub(r"<[^>]+>", " ", row) for row in table.split("<tr>")[1:]]
    return {
        name: " ".join(row.split()) for row in rows for name in (NODE_B, settings.APPLIANCE_NODE_NAME) if name in row
    }


def test_jobs_spread_over_two_nodes_follow_their_document_and_survive_a_node_lost(
    alice, node_a, node_b, live_appliance, django_user_model
):
    console = Client()
    console.force_login(django_user_model.objects.create_superuser(username="operator", password="x" * 20))
    here, there = node_a, node_b.engine
    node_name = settings.APPLIANCE_NODE_NAME
    # The cluster view of the one web process lists both nodes, up, each with its engine.
    health = json.loads(_get(f"{live_appliance}/healthz"))
    listed = {n["name"]: n for n in health["nodes"]["nodes"]}
    assert listed[NODE_B]["up"] and listed[settings.APPLIANCE_NODE_NAME]["up"]
    assert listed[NODE_B]["engine"]["kv_capacity_tokens"] > 0
    assert f'appliance_node_up{{node="{NODE_B}"}} 1.0' in _get(f"{live_appliance}/metrics")
    rows = _console_nodes(console)
    assert rows[NODE_B].startswith(f"{NODE_B} up") and rows[node_name].startswith(f"{node_name} up"), rows

    # Spread: more summaries at once than node A's prefill pool holds (2).
    texts = ["Apache-2.0", "MPL-2.0", "GPL-2", "LGPL-2.1"]
    documents = [ready_document(alice, name, (LICENCES / name).read_text()[:4000]) for name in texts]
    jobs = [services.job_create_summary(owner=alice, document=d, max_tokens=24, ignore_eos=True) for d in documents]
    finished = [wait_until(lambda j=j: _finished(j.pk), timeout_s=900, message="a summary") for j in jobs]
    assert all(j.state == Job.State.SUCCEEDED for j in finished), [j.error for j in finished]
    engines = [j.engine for j in finished]
    assert here in engines and there in engines, engines

    # A document's second job goes to the engine that holds its prompt, and reads it from its cache.
    # Both at once: each runs on its own engine.
    second_jobs = [
        (summary, services.job_create_clauses(owner=alice, document=summary.document, taxonomy="office"))
        for summary in (next(j for j in finished if j.engine == e) for e in (here, there))
    ]
    for summary, clauses in second_jobs:
        clauses = wait_until(lambda c=clauses: _finished(c.pk), timeout_s=900, message="the clause extraction")
        assert clauses.state == Job.State.SUCCEEDED, clauses.error
        assert clauses.engine == summary.engine
        assert clauses.metrics.cached_prompt_tokens > 0

    # Node B is lost while it runs a job: the job is handed on and finishes on node A. A summary
    # of a document each engine read goes back to that engine (its prompt is in its cache).
    read_by = [next(j.document for j in finished if j.engine == engine) for engine in (there, here)]
    long = [services.job_create_summary(owner=alice, document=d, max_tokens=256, ignore_eos=True) for d in read_by]
    victim = wait_until(
        lambda: Job.objects.filter(pk__in=[j.pk for j in long], state=Job.State.RUNNING, engine=there).first(),
        timeout_s=600, message="a job running on node B",
    )  # fmt: skip
    time.sleep(2)  # in the middle of it
    kill_tree(node_b.process.pid)
    victim = wait_until(lambda: _finished(victim.pk), timeout_s=900, message="the job node B held")
    assert victim.state == Job.State.SUCCEEDED, victim.error
    assert victim.engine == here and victim.attempts >= 2
    for job in long:
        assert (
            wait_until(lambda j=job: _finished(j.pk), timeout_s=900, message="a summary").state == Job.State.SUCCEEDED
        )

    # The web process shows node B down, node A up.
    def b_down():
        view = {n["name"]: n for n in json.loads(_get(f"{live_appliance}/healthz"))["nodes"]["nodes"]}
        return not view[NODE_B]["up"] and view[settings.APPLIANCE_NODE_NAME]["up"]

    wait_until(b_down, timeout_s=settings.APPLIANCE_NODE_DOWN_AFTER_S + 30, message="node B shown down")
    assert f'appliance_node_up{{node="{NODE_B}"}} 0.0' in _get(f"{live_appliance}/metrics")
    rows = _console_nodes(console)
    assert rows[NODE_B].startswith(f"{NODE_B} down") and rows[node_name].startswith(f"{node_name} up"), rows
