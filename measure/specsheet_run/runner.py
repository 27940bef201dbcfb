"""The command's options and its run: plan, appliance, account, workload, sheet."""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from inference.specsheet import PROFILES
from measure.benchmarking import (
    Progress,
    check_migrated,
    ensure_embedded_broker,
    ensure_embedded_database,
)
from measure.specsheet_run.account import _Account
from measure.specsheet_run.appliance import _Appliance, _stop_service
from measure.specsheet_run.client import _Client
from measure.specsheet_run.hardware import _memory_bandwidth
from measure.specsheet_run.plan import _Plan
from measure.specsheet_run.sheet import _assemble, _write
from measure.specsheet_run.workload import _Workload


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
