"""The appliance the sheet measures: the running one, or processes of this command's own."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
from django.conf import settings
from django.core.management.base import CommandError

from appliance.embedded import free_port
from appliance.env import env_int
from appliance.processes import start_appliance_processes, stop_groups
from measure.benchmarking import (
    Progress,
    served_queues,
    wait_for_engine,
    wait_for_queues,
)

QUEUES = {"ingest", "prefill", "decode"}


def _stop_service(service, progress: Progress) -> None:
    progress("stopping the embedded service this command started")
    service.stop()


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
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        self.progress("starting an engine host, workers and a web server of this command's own (a minute or two)")
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE}
        self.started = start_appliance_processes(
            {"engine", "ingest-worker", "prefill-worker", "decode-worker", "web"},
            settings=settings, tag="specsheet", env=env, log_dir=self.log_dir, port=port,
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
