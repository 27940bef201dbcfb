"""``manage.py bench cluster``: several nodes on this machine, sharing its Postgres and broker, as a
cluster runs them: each node is ``manage.py serve --roles engine,prefill,decode`` with a name of
its own, its own engine host and its own workers.

1. ``one``: node 1 alone. Each of ``--documents`` documents gets a summary, then a clause
   extraction: jobs per minute, and the clause extractions' prefix-cache hits (prompt tokens
   read from the cache / prompt tokens), as on one box.
2. ``all``: the other nodes join; the same on fresh documents. Jobs per node, the share of clause
   extractions that ran on the engine that ran their document's summary, their prefix-cache
   hits, and the ratios to phase 1 (hits: target >= 1, "as often as on one node").
3. ``lost``: long summaries on every node; once one runs on the last node, that node (engine
   host, engine core and workers) is killed at once. How long its job took to start again on
   another node (the job watchdog notices a worker that stopped reporting after
   ``APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S``), and to finish; no job is lost.

On this CPU the nodes share two cores, so phase 2's throughput says nothing about scaling; on a
GPU cluster, run it with nodes of one GPU each (``APPLIANCE_ENGINE_GPUS`` per node is set from
``--gpus-per-node``) and it shows throughput from 1 to N nodes. The benchmark refuses to run
beside an appliance whose workers already serve the queues (they would take its jobs).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError

from measure.benchmarking import (
    Progress,
    bench_user,
    check_migrated,
    ensure_embedded_broker,
    ensure_embedded_database,
    served_queues,
    synthetic_rng,
    synthetic_text,
)

HELP = "several nodes on this machine: jobs per node, prefix-cache hits across nodes, a node lost mid-job"


def add_arguments(parser) -> None:
    parser.add_argument("--nodes", type=int, default=2, help="nodes to start (2 or more)")
    parser.add_argument("--documents", type=int, default=4, help="documents per phase (a summary, then clauses, each)")
    parser.add_argument("--document-words", type=int, default=1200, help="words per document")
    parser.add_argument("--summary-tokens", type=int, default=32, help="output tokens of a summary in phases 1-2")
    parser.add_argument("--gpus-per-node", type=int, default=0, help="GPUs each node's engine uses (0: CPU)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds any one phase may take")
    parser.add_argument("--seed", type=int, default=20261203)


class Node:
    def __init__(self, index: int, *, gpus: list[int]) -> None:
        self.name = f"bench-node-{index + 1}"
        self.var_dir = Path(settings.VAR_DIR) / "bench-cluster" / self.name
        self.gpus = gpus
        self.process: Any = None

    @property
    def engine(self) -> str:
        from inference.placement import engine_key

        return engine_key(self.name, f"unix:{self.var_dir / 'run' / 'engine.sock'}")

    def start(self) -> None:
        from appliance.processes import start

        env = {**os.environ, "DATABASE_URL": settings.DATABASE_URL, "REDIS_URL": settings.REDIS_URL,
               "APPLIANCE_VAR_DIR": str(self.var_dir), "APPLIANCE_NODE_NAME": self.name,
               "APPLIANCE_NODE_HEARTBEAT_S": "1", "APPLIANCE_PREFILL_CONCURRENCY": "2"}  # fmt: skip
        for name in ("APPLIANCE_ENGINE_SOCKET", "APPLIANCE_ENGINE_URL", "APPLIANCE_ENGINE_TOKEN"):
            env.pop(name, None)  # its own engine host, at its own socket, with its own token
        if self.gpus:
            env["APPLIANCE_ENGINE_GPUS"] = ",".join(map(str, self.gpus))
        self.process = start([sys.executable, "manage.py", "serve", "--roles", "engine,prefill,decode"],
                             cwd=settings.BASE_DIR, env=env, log_path=self.var_dir / "serve.log", fresh_log=True,
                             tie_to_parent=True)  # fmt: skip

    def ready(self) -> bool:
        from appliance.cluster import nodes

        if self.process.poll() is not None:
            raise CommandError(f"node {self.name} exited; see {self.var_dir / 'serve.log'}")
        view = next((n for n in nodes() if n["name"] == self.name), None)
        return view is not None and view["up"] and view["engine"]["state"] == "ready"

    def kill(self) -> None:
        """SIGKILL the node's serve and everything it started: a node that loses power."""
        from appliance.processes import kill_tree

        kill_tree(self.process.pid)

    def forget(self) -> None:
        from appliance.cluster import forget

        with contextlib.suppress(Exception):
            forget(self.name)


def _wait(predicate, *, timeout_s: float, what: str, interval_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise CommandError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _documents(owner, rng: random.Random, n: int, words: int, tag: str) -> list:
    from documents.models import Document, Page

    made = []
    for i in range(n):
        text = synthetic_text(rng, words)
        pages = [text[j : j + 3000] for j in range(0, len(text), 3000)]
        document = Document.objects.create(
            owner=owner, title=f"Cluster benchmark {tag} {i + 1}", filename=f"cluster-{tag}-{i + 1}.txt",
            kind=Document.Kind.TEXT, size_bytes=len(text.encode()),
            sha256=hashlib.sha256(f"{tag}:{i}:{text}".encode()).hexdigest(), file="",
            state=Document.State.READY, pages_total=len(pages), pages_done=len(pages),
        )  # fmt: skip
        starts = [sum(len(p) for p in pages[:k]) for k in range(len(pages))]
        Page.objects.bulk_create(
            [Page(document=document, number=k + 1, text=p, char_start=starts[k]) for k, p in enumerate(pages)]
        )
        made.append(document)
    return made


def _finished(job_ids, timeout_s: float, what: str) -> list:
    from inference.models import Job

    def done():
        jobs = list(Job.objects.select_related("metrics").filter(pk__in=job_ids))
        return jobs if all(j.is_finished for j in jobs) else None

    jobs = _wait(done, timeout_s=timeout_s, what=what, interval_s=1.0)
    failed = [j for j in jobs if j.state != Job.State.SUCCEEDED]
    if failed:
        raise CommandError(f"{len(failed)} job(s) of {what} did not succeed: {failed[0].error}")
    return jobs


def _pairs(owner, documents, *, summary_tokens: int, timeout_s: float) -> dict:
    """A summary of each document, then a clause extraction of each."""
    from inference import services

    started = time.monotonic()
    summaries = [services.job_create_summary(owner=owner, document=d, max_tokens=summary_tokens, ignore_eos=True)
                 for d in documents]  # fmt: skip
    summaries = _finished([j.pk for j in summaries], timeout_s, "the summaries")
    clauses = [services.job_create_clauses(owner=owner, document=d, taxonomy="office") for d in documents]
    clauses = _finished([j.pk for j in clauses], timeout_s, "the clause extractions")
    elapsed = time.monotonic() - started
    ran_on = {j.document_id: j.engine for j in summaries}
    prompt = sum(j.metrics.prompt_tokens or 0 for j in clauses)
    cached = sum(j.metrics.cached_prompt_tokens or 0 for j in clauses)
    per_engine: dict[str, int] = {}
    for job in [*summaries, *clauses]:
        per_engine[job.engine] = per_engine.get(job.engine, 0) + 1
    return {
        "jobs": len(summaries) + len(clauses),
        "seconds": round(elapsed, 1),
        "jobs_per_minute": round(60 * (len(summaries) + len(clauses)) / elapsed, 2),
        "jobs_per_engine": per_engine,
        "clauses_on_their_summarys_engine": round(sum(j.engine == ran_on[j.document_id] for j in clauses) / len(clauses), 3),
        "clause_prompt_tokens": prompt,
        "clause_cached_prompt_tokens": cached,
        "clause_cache_hit_rate": round(cached / prompt, 3) if prompt else None,
    }  # fmt: skip


def _lost(owner, documents, nodes: list[Node], *, timeout_s: float, progress) -> dict:
    from inference import services
    from inference.models import Job

    victim_node = nodes[-1]
    jobs = [services.job_create_summary(owner=owner, document=d, max_tokens=256, ignore_eos=True) for d in documents]
    ids = [j.pk for j in jobs]
    victim = _wait(lambda: Job.objects.filter(pk__in=ids, state=Job.State.RUNNING, engine=victim_node.engine).first(),
                   timeout_s=timeout_s, what=f"a job running on {victim_node.name}")  # fmt: skip
    time.sleep(2.0)  # in the middle of it
    progress(f"lost: killing {victim_node.name} (engine host, engine core, workers) while it runs job {victim.pk}")
    killed = time.monotonic()
    victim_node.kill()
    moved = _wait(lambda: Job.objects.filter(pk=victim.pk, state=Job.State.RUNNING).exclude(engine=victim_node.engine)
                  .exists() or Job.objects.get(pk=victim.pk).is_finished, timeout_s=timeout_s,
                  what="the lost node's job to start again elsewhere")  # fmt: skip
    restarted_s = time.monotonic() - killed
    finished = _finished(ids, timeout_s, "the summaries of the lost node's phase")
    finished_s = time.monotonic() - killed
    job = next(j for j in finished if j.pk == victim.pk)
    return {
        "killed_node": victim_node.name,
        "jobs": len(finished),
        "jobs_lost": 0,  # _finished raises for any that did not succeed
        "moved": bool(moved),
        "job_finished_on": job.engine,
        "seconds_to_start_elsewhere": round(restarted_s, 1),
        "seconds_to_finish": round(finished_s, 1),
        "heartbeat_timeout_s": settings.APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S,
    }


def run(command, **options) -> dict:
    from documents.models import Document
    from inference.models import Job

    progress = Progress(command.stdout.write)
    if options["nodes"] < 2:
        raise CommandError("--nodes must be 2 or more")
    started_services = [s for s in (ensure_embedded_database(progress), ensure_embedded_broker(progress)) if s]
    nodes: list[Node] = []
    owner = None
    try:
        check_migrated(progress)
        busy = {name for name, queues in served_queues().items() if {"prefill", "decode"} & queues}
        if busy:
            raise CommandError(f"workers already serve the inference queues ({', '.join(sorted(busy))}): stop the "
                               "appliance first, or they take this benchmark's jobs")  # fmt: skip
        owner = bench_user("bench-cluster")
        per = options["gpus_per_node"]
        nodes = [Node(i, gpus=list(range(i * per, (i + 1) * per))) for i in range(options["nodes"])]
        rng = synthetic_rng(options["seed"])
        timeout = options["timeout"]
        words, tokens = options["document_words"], options["summary_tokens"]

        progress(f"starting {nodes[0].name} (this takes a minute or two)")
        nodes[0].start()
        _wait(nodes[0].ready, timeout_s=timeout, what=f"{nodes[0].name}'s engine", interval_s=1.0)
        progress("one: one node, a summary then a clause extraction of each document")
        one = _pairs(owner, _documents(owner, rng, options["documents"], words, "one"), summary_tokens=tokens,
                     timeout_s=timeout)  # fmt: skip
        progress(f"one: {one}")

        progress(f"starting {', '.join(n.name for n in nodes[1:])}")
        for node in nodes[1:]:
            node.start()
        for node in nodes[1:]:
            _wait(node.ready, timeout_s=timeout, what=f"{node.name}'s engine", interval_s=1.0)
        progress(f"all: {len(nodes)} nodes, the same on fresh documents")
        every = _pairs(owner, _documents(owner, rng, options["documents"], words, "all"), summary_tokens=tokens,
                       timeout_s=timeout)  # fmt: skip
        progress(f"all: {every}")

        lost = _lost(owner, _documents(owner, rng, len(nodes) * 2, words, "lost"), nodes, timeout_s=timeout,
                     progress=progress)  # fmt: skip
        progress(f"lost: {lost}")
        result = {
            "nodes": [n.name for n in nodes],
            "engines": {n.name: n.engine for n in nodes},
            "options": {k: v for k, v in options.items() if k in ("nodes", "documents", "document_words",
                                                                   "summary_tokens", "gpus_per_node", "seed")},
            "one": one,
            "all": every,
            "lost": lost,
            "hit_rate_vs_one_node": _ratio(every["clause_cache_hit_rate"], one["clause_cache_hit_rate"]),
            "throughput_vs_one_node": _ratio(every["jobs_per_minute"], one["jobs_per_minute"]),
        }  # fmt: skip
        _table(command, result)
        return result
    finally:
        for node in reversed(nodes):
            if node.process is not None:
                node.kill()
            node.forget()
        if owner is not None:
            Job.objects.filter(owner=owner).delete()
            Document.objects.filter(owner=owner).delete()
        for service in reversed(started_services):
            progress(f"stopping the embedded {service.name} this benchmark started")
            service.stop()


def _ratio(a, b) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def _table(command, r: dict) -> None:
    write = command.stdout.write
    write("")
    write(f"Cluster benchmark: {len(r['nodes'])} nodes on this machine")
    write(f"{'phase':<8}{'jobs/min':>10}{'clauses on summary engine':>28}{'clause cache hits':>20}  jobs per engine")
    for phase in ("one", "all"):
        p = r[phase]
        per = ", ".join(f"{k.split('/')[0]} {v}" for k, v in sorted(p["jobs_per_engine"].items()))
        write(f"{phase:<8}{p['jobs_per_minute']:>10}{p['clauses_on_their_summarys_engine']:>28}"
              f"{str(p['clause_cache_hit_rate']):>20}  {per}")  # fmt: skip
    write(f"cache hits across nodes / on one node: x{r['hit_rate_vs_one_node']}; "
          f"throughput x{r['throughput_vs_one_node']} (nodes share this machine's cores)")  # fmt: skip
    lost = r["lost"]
    write(f"lost {lost['killed_node']} mid-job: its job started again elsewhere after {lost['seconds_to_start_elsewhere']} s "
          f"(heartbeat timeout {lost['heartbeat_timeout_s']} s), all {lost['jobs']} jobs finished after "
          f"{lost['seconds_to_finish']} s, {lost['jobs_lost']} lost")  # fmt: skip
