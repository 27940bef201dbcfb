"""What the appliance's benchmarks share: progress lines, the embedded services they need,
a user of their own, synthetic contract-like text and a description of the machine."""

from __future__ import annotations

import contextlib
import os
import platform
import random
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.core.management.base import CommandError

from appliance.processes import start


@dataclass
class Progress:
    write: Callable[[str], None]
    started: float = field(default_factory=time.perf_counter)

    def __call__(self, message: str) -> None:
        self.write(f"[{time.perf_counter() - self.started:7.1f} s] {message}")


@contextlib.contextmanager
def sigterm_as_exit():
    """A SIGTERM (``kill``, a CI limit) ends a long command as Ctrl-C would, by an exception in
    its main thread, so its ``finally`` blocks stop the engine host, workers and services it
    started instead of leaving them running without it."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum, _frame):
        # Once: a second SIGTERM (an impatient caller) must not cut short the clean-up the first
        # started, which would leave the engine host it is stopping running without it.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def ensure_embedded_database(progress):
    """Start the embedded Postgres if the appliance uses it and it is not running."""
    if settings.DATABASE_URL != settings.EMBEDDED_DATABASE_URL:
        return None
    from appliance.embedded import embedded_services

    postgres, _ = embedded_services(settings.VAR_DIR, settings.EMBEDDED_PG_PORT, settings.EMBEDDED_REDIS_PORT)
    if postgres.is_running():
        return None
    progress(f"starting the embedded Postgres on 127.0.0.1:{postgres.port}")
    return _kept(postgres) if postgres.start() else None


def ensure_embedded_broker(progress):
    """Start the embedded Valkey if the appliance uses it and it is not running."""
    if settings.REDIS_URL != settings.EMBEDDED_REDIS_URL:
        return None
    from appliance.embedded import embedded_services

    _, valkey = embedded_services(settings.VAR_DIR, settings.EMBEDDED_PG_PORT, settings.EMBEDDED_REDIS_PORT)
    if valkey.is_running():
        return None
    progress(f"starting the embedded Valkey on 127.0.0.1:{valkey.port}")
    return _kept(valkey) if valkey.start() else None


def _kept(service):
    """A service this run started, on the service cores as ``make run`` keeps it (``appliance.cpus``)."""
    from appliance import cpus

    cpus.keep_server(service.server_process(), cpus.service_cpus(settings))
    return service


def check_migrated(progress) -> None:
    """The embedded database is migrated here, as ``make run`` migrates it when it starts; an
    operator's own database is left alone, and a run against one with unapplied migrations is
    refused."""
    from django.core.management import call_command
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    if not executor.migration_plan(executor.loader.graph.leaf_nodes()):
        return
    if settings.DATABASE_URL != settings.EMBEDDED_DATABASE_URL:
        raise CommandError("The database has unapplied migrations: run `manage.py migrate` first.")
    progress("applying the migrations the embedded database lacks (as `make run` does)")
    call_command("migrate", interactive=False, verbosity=0)


def bench_user(username: str):
    """An inactive user that owns a benchmark's rows (it cannot sign in)."""
    from django.contrib.auth import get_user_model

    owner, created = get_user_model().objects.get_or_create(username=username, defaults={"is_active": False})
    if owner.is_active:  # a person's account: the run would delete its documents and jobs afterwards
        raise CommandError(
            f"A real account is called {username!r}; this command keeps its rows under that name and deletes "
            "them afterwards. Rename the account first."
        )
    if created:
        owner.set_unusable_password()
        owner.save(update_fields=["password"])
    return owner


def api_bench_user(username: str, *, deletes: str):
    """An active user with no usable password, for a command that measures through the API under
    a token of its own: refused when a person's account has the name (``deletes`` says what the
    command removes afterwards)."""
    from django.contrib.auth import get_user_model

    user, created = get_user_model().objects.get_or_create(username=username)
    if not created and (user.has_usable_password() or user.is_staff or user.is_superuser):
        raise CommandError(
            f"A person's account is called {username!r}; this command measures under that name and deletes its "
            f"{deletes} afterwards. Rename the account first."
        )
    user.set_unusable_password()
    user.is_active = True
    user.save(update_fields=["password", "is_active"])
    return user


def machine() -> dict:
    import torch
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('server_version'), (SELECT extversion FROM pg_extension WHERE extname = 'vector')"
        )
        server_version, pgvector_version = cursor.fetchone()
    return {
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "postgres": server_version,
        "pgvector": pgvector_version,
        "load_average_at_start": os.getloadavg(),
    }


def ingest_worker() -> dict:
    """How the ingest worker a benchmark starts runs on the CPU (its settings): its niceness and
    its embedding's CPU class."""
    from django.conf import settings

    return {"nice": settings.APPLIANCE_INGEST_NICE, "cpu_class": settings.APPLIANCE_INGEST_CPU_CLASS}


# --- synthetic text ---------------------------------------------------------------------------

_SUBJECTS = (
    "The supplier", "The customer", "Each party", "The contractor", "The landlord", "The tenant", "The employer",
    "The auditor", "The board", "The licensee", "The service provider", "The purchaser", "The agent", "Staff",
)  # fmt: skip
_VERBS = (
    "shall deliver", "may terminate", "must notify", "will invoice", "agrees to maintain", "shall keep",
    "may review", "must pay", "will provide", "shall insure", "may assign", "must return", "shall publish",
    "will reconcile", "may inspect", "shall renew",
)  # fmt: skip
_OBJECTS = (
    "the quarterly report", "all outstanding invoices", "the premises", "any confidential information",
    "the payroll software", "the delivery schedule", "the service credits", "the escrow deposit", "written notice",
    "the annual budget", "the data processing records", "the insurance certificate", "the spare parts inventory",
    "the migration plan", "the training material", "the safety inspection results", "the licence keys",
)  # fmt: skip
_CONDITIONS = (
    "within thirty days", "before the end of each month", "unless agreed otherwise in writing", "at its own cost",
    "in accordance with clause {n}", "during the initial term", "after the renewal date", "without undue delay",
    "no later than {n} working days after a request", "as set out in schedule {n}", "subject to clause {n}",
    "for a period of {n} years", "to the reasonable satisfaction of the customer", "on the first of each quarter",
)  # fmt: skip


def synthetic_rng(seed: int) -> random.Random:
    # Synthetic text for a benchmark, reproducible from the seed: nothing secret depends on it.
    return random.Random(seed)  # noqa: S311


def synthetic_sentence(rng: random.Random) -> str:
    condition = rng.choice(_CONDITIONS).format(n=rng.randint(2, 24))
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {condition}."


def synthetic_text(rng: random.Random, words: int) -> str:
    sentences: list[str] = []
    while sum(len(s.split()) for s in sentences) < words:
        sentences.append(synthetic_sentence(rng))
    return " ".join(sentences)


# Text no one here wrote, for workloads whose outputs should be a model's real answers (the
# public licence texts every Debian system carries; one paragraph per blank-line block).
REAL_TEXT_DIR = Path("/usr/share/common-licenses")

# What staff ask of a passage, from a one-word answer to a letter: a model's answers to these end
# at its end-of-sequence token at lengths that vary as real drafting's do.
REAL_ASKS = (
    "Answer yes or no: does this passage let the reader change the text?",
    "Which party does this passage protect? Name it only.",
    "Write a one-line title for this passage.",
    "Summarise this passage in two sentences.",
    "Explain this passage to a new colleague in plain words.",
    "Draft a short e-mail to a colleague saying what this passage requires of us.",
    "Draft a reply to a customer who asked whether this passage allows them to sell copies.",
    "What must a person who redistributes the work do, according to this passage?",
)


def real_paragraphs(folder: Path = REAL_TEXT_DIR) -> list[str]:
    """The paragraphs of the text files in ``folder`` (sorted, so reproducible; a file linked
    under a second name read once), whitespace folded; empty where the folder is missing (the
    caller falls back to synthetic text)."""
    paragraphs: list[str] = []
    if not folder.is_dir():
        return paragraphs
    seen: set[Path] = set()
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        if path.resolve() in seen:  # GPL -> GPL-3: one text, read once
            continue
        seen.add(path.resolve())
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for block in re.split(r"\n\s*\n", text):
            folded = " ".join(block.split())
            if len(folded.split()) >= 8:
                paragraphs.append(folded)
    return paragraphs


def real_passage(paragraphs: list[str], start: int, *, words: int) -> str:
    """Consecutive paragraphs from ``start`` (going round to the first after the last) of at most
    ``words`` words together; a first paragraph longer than that is cut to it, so a passage is
    never empty and never longer than asked."""
    taken: list[str] = []
    count = 0
    for paragraph in paragraphs[start:] + paragraphs[:start]:
        size = len(paragraph.split())
        if count + size > words:
            if not taken:
                taken.append(" ".join(paragraph.split()[:words]))
            break
        taken.append(paragraph)
        count += size
    return "\n\n".join(taken)


# --- processes a benchmark or an evaluation starts for itself ------------------------------------


def start_logged(argv: list[str], *, env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """A process of the benchmark's (in its own group), its output appended to ``log_path``."""
    return start(argv, cwd=settings.BASE_DIR, env=env, log_path=log_path)


def wait_for_engine(socket: Path, *, process: subprocess.Popen | None, log_path: Path, timeout_s: float = 900) -> dict:
    """The engine host's stats once it answers on ``socket``."""
    from inference.engine.client import EngineClient, EngineUnavailable

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return EngineClient(socket, connect_timeout_s=5.0).stats()
        except EngineUnavailable:
            if process is not None and process.poll() is not None:
                raise CommandError(f"the engine host exited; see {log_path}") from None
            if time.monotonic() > deadline:
                raise CommandError(f"the engine host did not answer within {timeout_s:.0f} s; see {log_path}") from None
            time.sleep(2)


def served_queues() -> dict[str, set[str]]:
    """Worker name -> the queues it consumes, for every worker that answers."""
    from appliance.celery import app

    replies = app.control.inspect(timeout=1.0).active_queues() or {}
    return {name: {q["name"] for q in queues} for name, queues in replies.items()}


def wait_for_queues(wanted: set[str], *, log_dir: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not wanted <= set().union(*served_queues().values()):
        if time.monotonic() > deadline:
            raise CommandError(f"workers did not start; see {log_dir}")
        time.sleep(0.5)
