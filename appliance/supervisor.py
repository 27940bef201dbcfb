"""The single-box supervisor behind ``make run`` (``manage.py serve``).

It starts the embedded services when no external ones are configured, prepares the model,
migrates, makes sure an administrator exists, then starts and watches the processes of the
appliance: the ASGI web server, the engine host and one Celery worker pool per queue. A process
that dies is started again (with a growing pause if it keeps dying); so is an embedded service
it started (Postgres, Valkey), whose server process it watches. Ctrl-C or SIGTERM stops the
processes, newest first, then those services, newest first.

Nothing else is restarted when a service comes back: each process's database pool checks a
connection before handing it out (``CONN_HEALTH_CHECKS``) and opens new ones, and the Celery
workers reconnect to the broker by themselves. A service's restart runs in the watch loop
(Valkey in well under a second, Postgres in seconds of crash recovery), so no other process is
noticed dying meanwhile.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TextIO

from appliance import cpus
from appliance.processes import signal_group, start, stop_groups

logger = logging.getLogger("appliance.supervisor")

# A process or service that dies sooner than this after starting waits longer each time before
# it is started again (2, 4, 8, ... s, up to ``max_backoff_s``); one that ran longer, half a second.
QUICK_DEATH_S = 60.0


# The roles a node of the appliance can run (``manage.py serve --roles``): each is one process of
# ``appliance_processes``. A single box runs them all.
ROLES = ("engine", "ingest", "prefill", "decode", "web")
# Those whose processes run on the service cores (``appliance.cpus``): not the engine (vLLM
# binds its model's threads itself), not the ingest (its embedding uses every core nobody else does).
SERVICE_ROLES = ("prefill", "decode", "web")


class AlreadyServing(RuntimeError):
    """Another ``manage.py serve`` holds this var directory (``ServeLock``)."""


class ServeLock:
    """One ``manage.py serve`` per var directory: an exclusive lock on ``run/serve.lock`` held
    for the supervisor's life (the kernel drops it when the process ends, however it ends; the
    processes it starts do not inherit it). A second one started meanwhile, or while the first
    is still stopping, would take the first's embedded Postgres as "already running", use it
    without watching it, and lose its database when the first stops it."""

    def __init__(self, var_dir: Path) -> None:
        self.path = Path(var_dir) / "run" / "serve.lock"
        self._file: TextIO | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # noqa: SIM115 - held open for the supervisor's life
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise AlreadyServing(
                f"Another `manage.py serve` (pid {holder}) is running on {self.path.parent.parent}, or is still "
                "stopping: wait until it has stopped, or give this one its own APPLIANCE_VAR_DIR (and ports)."
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._file = handle

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class RolesError(ValueError):
    """A ``--roles`` / ``APPLIANCE_ROLES`` value that names no role, or one that does not exist."""


def parse_roles(text: str | None) -> tuple[str, ...]:
    """``"web,ingest"`` -> ("ingest", "web") in ``ROLES`` order; None or "all" -> every role."""
    if text is None or text.strip().lower() == "all":
        return ROLES
    wanted = {part.strip().lower() for part in text.split(",") if part.strip()}
    unknown = sorted(wanted - set(ROLES))
    if unknown:
        raise RolesError(f"unknown role(s) {', '.join(unknown)}; the roles are {', '.join(ROLES)} (or all)")
    if not wanted:
        raise RolesError(f"no role given; the roles are {', '.join(ROLES)} (or all)")
    return tuple(role for role in ROLES if role in wanted)


@dataclass
class ProcessSpec:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    role: str = ""  # one of ROLES for the appliance's own processes
    cpus: frozenset[int] | None = None  # where it runs (``appliance.cpus``); None: anywhere


class ServerProcess(Protocol):
    pid: int

    def alive(self) -> bool: ...


class Service(Protocol):
    """An embedded service (``appliance.embedded``): a server that runs detached, named by its pid."""

    name: str

    def start(self) -> bool: ...

    def stop(self) -> None: ...

    def server_process(self) -> ServerProcess | None: ...


@dataclass
class _Running:
    spec: ProcessSpec
    process: subprocess.Popen
    started_at: float
    restarts: int = 0  # quick deaths in a row
    next_start_at: float | None = None


@dataclass
class _Watched:
    service: Service
    server: ServerProcess | None
    started_at: float
    restarts: int = 0  # quick deaths (or failed starts) in a row
    next_start_at: float | None = None

    @property
    def up(self) -> bool:
        return self.next_start_at is None and self.server is not None and self.server.alive()


def engine_slots(settings) -> list[dict[str, str]]:
    """Each engine host of this node (``APPLIANCE_ENGINES``): the environment that sets it apart,
    its GPUs (``CUDA_VISIBLE_DEVICES``, ``APPLIANCE_TENSOR_PARALLEL_SIZE`` of them) and its socket
    (the first keeps ``APPLIANCE_ENGINE_SOCKET``, so one engine is declared as it always was), and
    its TCP port when it listens (the next ports for the next engines). One empty dict for one
    engine on no GPU named (and for settings that do not say: a benchmark's pool caps)."""
    count = getattr(settings, "APPLIANCE_ENGINES", 1)
    tp = getattr(settings, "APPLIANCE_TENSOR_PARALLEL_SIZE", 1)
    if count == 1 and tp == 1 and not getattr(settings, "APPLIANCE_ENGINE_GPUS", None):
        return [{}]
    gpus = list(settings.APPLIANCE_ENGINE_GPUS) or ([str(i) for i in range(count * tp)] if count > 1 or tp > 1 else [])
    if gpus and len(gpus) < count * tp:
        raise RolesError(
            f"APPLIANCE_ENGINES={count} x APPLIANCE_TENSOR_PARALLEL_SIZE={tp} needs {count * tp} GPUs; "
            f"APPLIANCE_ENGINE_GPUS names {len(gpus)} ({','.join(gpus)})"
        )
    socket = Path(settings.APPLIANCE_ENGINE_SOCKET)
    listen = settings.APPLIANCE_ENGINE_LISTEN
    slots = []
    for i in range(count):
        env: dict[str, str] = {}
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[i * tp : (i + 1) * tp])
        if i:
            env["APPLIANCE_ENGINE_SOCKET"] = str(socket.with_name(f"{socket.stem}-{i}{socket.suffix}"))
            if listen:
                host, _, port = listen.rpartition(":")
                env["APPLIANCE_ENGINE_LISTEN"] = f"{host}:{int(port) + i}"
        slots.append(env)
    return slots


def appliance_processes(*, python: str, port: int, settings, roles: Sequence[str] = ROLES) -> list[ProcessSpec]:
    """The one declaration of the appliance's processes: for each role its command line (the same
    for ``manage.py serve``, the test fixtures, the benchmarks and the evaluation), in the order
    they start; only those of ``roles``. With several engines on the node (``engine_slots``), each
    has its own engine host and its own prefill and decode workers, which reach it at its socket."""
    manage = [python, str(Path(settings.BASE_DIR) / "manage.py")]
    celery = [
        python,
        "-m",
        "celery",
        "-A",
        "appliance",
        "worker",
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
    ]
    specs = [
        ProcessSpec("engine", [*manage, "engine_host"], role="engine"),
        ProcessSpec(
            "ingest-worker",
            [
                *celery,
                "-Q",
                "ingest",
                "-n",
                "ingest@%h",
                "--pool",
                "threads",  # documents side by side, their passages embedded together
                "-c",
                str(settings.APPLIANCE_INGEST_CONCURRENCY),
            ],
            role="ingest",
        ),  # fmt: skip
        ProcessSpec(
            "prefill-worker",
            [
                *celery,
                "-Q",
                "prefill",
                "-n",
                "prefill@%h",
                "--pool",
                "threads",
                "-c",
                str(settings.APPLIANCE_PREFILL_CONCURRENCY),
            ],
            role="prefill",
        ),
        ProcessSpec(
            "decode-worker",
            [
                *celery,
                "-Q",
                "decode",
                "-n",
                "decode@%h",
                "--pool",
                "threads",
                "-c",
                str(settings.APPLIANCE_DECODE_CONCURRENCY),
            ],
            role="decode",
        ),
        ProcessSpec(
            "web",
            [
                python,
                "-m",
                "uvicorn",
                "appliance.asgi:application",
                "--host",
                getattr(settings, "APPLIANCE_WEB_HOST", "127.0.0.1"),
                "--port",
                str(port),
                "--no-access-log",
                "--timeout-graceful-shutdown",
                "5",
            ],
            role="web",
        ),  # fmt: skip
    ]
    if getattr(settings, "CELERY_BEAT_SCHEDULE", None):  # a benchmark's pool caps name none
        # Periodic tasks (the LDAP sync): one scheduler for the whole appliance, beside the one web
        # server (a node without the web role runs none), its state under var/.
        schedule = Path(settings.VAR_DIR) / "celerybeat-schedule"
        specs.append(
            ProcessSpec(
                "beat",
                [python, "-m", "celery", "-A", "appliance", "beat", "--loglevel", "INFO", "--schedule", str(schedule)],
                role="web",
            )
        )
    service_cpus = cpus.service_cpus(settings)
    for spec in specs:
        if spec.role in SERVICE_ROLES:  # the scheduler (beat) too: it is of the web role
            spec.cpus = service_cpus
    slots = engine_slots(settings)
    if "engine" in roles and slots != [{}]:  # a node without engines uses APPLIANCE_ENGINE_URL's
        specs = _per_engine(specs, slots, Path(settings.APPLIANCE_ENGINE_SOCKET))
    return [spec for spec in specs if spec.role in roles]


def _per_engine(specs: list[ProcessSpec], slots: list[dict[str, str]], socket: Path) -> list[ProcessSpec]:
    """The engine host and its prefill and decode workers once per engine slot: ``engine``,
    ``engine-1``, ...; the workers of each reach their own engine's socket."""
    out: list[ProcessSpec] = []
    for spec in specs:
        if spec.role not in ("engine", "prefill", "decode"):
            out.append(spec)
            continue
        for i, slot in enumerate(slots):
            name = spec.name if i == 0 else f"{spec.name}-{i}"
            if spec.role == "engine":
                out.append(ProcessSpec(name, spec.argv, env={**spec.env, **slot}, role=spec.role))
                continue
            engine_socket = slot.get("APPLIANCE_ENGINE_SOCKET", str(socket))
            argv = [f"{spec.role}-{i}@%h" if arg == f"{spec.role}@%h" and i else arg for arg in spec.argv]
            out.append(ProcessSpec(name, argv, env={**spec.env, "APPLIANCE_ENGINE_URL": f"unix:{engine_socket}"},
                                   role=spec.role, cpus=spec.cpus))  # fmt: skip
    return out


class Supervisor:
    def __init__(
        self,
        specs: list[ProcessSpec],
        *,
        cwd: Path,
        services: Sequence[Service] = (),
        max_backoff_s: float = 30.0,
        service_cpus: frozenset[int] | None = None,
    ) -> None:
        """``services``: the embedded services this supervisor started (running already), in the
        order they were started; it watches them and stops them last, and keeps them on
        ``service_cpus`` (``appliance.cpus``), as each spec says of its process. A service
        someone else runs (an external ``DATABASE_URL``, one left by another session) is not for
        it to restart."""
        self.specs = specs
        self.cwd = cwd
        self.max_backoff_s = max_backoff_s
        self.service_cpus = service_cpus
        self.running: dict[str, _Running] = {}
        now = time.monotonic()
        self.services = [_Watched(service, service.server_process(), now) for service in services]
        for entry in self.services:
            cpus.keep_server(entry.server, service_cpus)
        self.stopping = False

    def _spawn(self, spec: ProcessSpec) -> subprocess.Popen:
        logger.info("starting %s", spec.name)
        # Its own group: Ctrl-C reaches the supervisor only, which stops the children in order.
        return start(spec.argv, cwd=self.cwd, env={**os.environ, **spec.env}, tie_to_parent=True, cpus=spec.cpus)

    def start_all(self) -> None:
        for spec in self.specs:
            self.running[spec.name] = _Running(spec, self._spawn(spec), time.monotonic())

    def _pause_after_death(self, entry: _Running | _Watched, lived_s: float) -> float:
        entry.restarts = 0 if lived_s > QUICK_DEATH_S else entry.restarts + 1
        return min(self.max_backoff_s, 2.0**entry.restarts) if entry.restarts else 0.5

    def poll_once(self) -> None:
        """Restart what died; one that dies within a minute of starting waits longer each time.
        Services first: a worker started again finds its broker and database back."""
        self._poll_services()
        now = time.monotonic()
        for entry in self.running.values():
            if entry.next_start_at is not None:
                if now >= entry.next_start_at and not self.stopping:
                    entry.process = self._spawn(entry.spec)
                    entry.started_at, entry.next_start_at = now, None
                continue
            code = entry.process.poll()
            if code is None or self.stopping:
                continue
            signal_group(entry.process, signal.SIGKILL)  # what it left behind (vLLM's engine core)
            lived = now - entry.started_at
            pause = self._pause_after_death(entry, lived)
            logger.error(
                "%s exited with code %s after %.0f s; starting it again in %.1f s", entry.spec.name, code, lived, pause
            )
            entry.next_start_at = now + pause

    def _poll_services(self) -> None:
        for entry in self.services:
            if self.stopping:
                return
            now = time.monotonic()
            if entry.next_start_at is not None:
                if now >= entry.next_start_at:
                    self._start_again(entry)
                continue
            if entry.server is not None and entry.server.alive():
                continue
            lived = now - entry.started_at
            pause = self._pause_after_death(entry, lived)
            logger.error(
                "%s (pid %s) is gone after %.0f s; starting it again in %.1f s",
                entry.service.name,
                entry.server.pid if entry.server is not None else "unknown",
                lived,
                pause,
            )
            entry.server, entry.next_start_at = None, now + pause

    def _start_again(self, entry: _Watched) -> None:
        name = entry.service.name
        logger.info("starting %s again", name)
        try:
            started = entry.service.start()
        except Exception as exc:  # whatever stopped it, the watch goes on
            pause = self._pause_after_death(entry, 0.0)  # a failed start counts as a quick death
            logger.error("%s did not start: %s; trying again in %.1f s", name, exc, pause)
            entry.next_start_at = time.monotonic() + pause
            return
        entry.server = entry.service.server_process()
        cpus.keep_server(entry.server, self.service_cpus)
        entry.started_at, entry.next_start_at = time.monotonic(), None
        if not started:
            logger.warning("%s: a server already answers on its port; watching the one its pid file names", name)
        logger.info("%s is back (pid %s)", name, entry.server.pid if entry.server is not None else "unknown")

    def stop_all(self, timeout_s: float = 30.0) -> None:
        """Stop the processes, newest first, then the services it watches, newest first."""
        self.stopping = True
        try:
            self._stop_processes(timeout_s)
        finally:
            for entry in reversed(self.services):
                if entry.up:
                    logger.info("stopping %s", entry.service.name)
                    entry.service.stop()

    def _stop_processes(self, timeout_s: float) -> None:
        entries = [e for e in reversed(list(self.running.values())) if e.process.poll() is None]
        for entry in entries:
            logger.info("stopping %s", entry.spec.name)
        # No grace: what a process left behind in its group once it has exited (vLLM's engine
        # core, pool children) is killed at once.
        names = [entry.spec.name for entry in entries]
        stop_groups([entry.process for entry in entries], timeout_s=timeout_s, grace_s=0, names=names)
