"""Keeping a CPU engine's cores for the model.

On a CPU, vLLM binds its model worker's threads to all of the machine's cores but the last
(``VLLM_CPU_OMP_THREADS_BIND=auto``, one core reserved, on x86 and Arm, for the engine core's
scheduler: ``vllm/utils/ompmultiprocessing.py``), and leaves every other process free to run
anywhere. So the web server, the decode and prefill workers, Postgres and Valkey were woken on
the model's core too, each time taking it from the model mid-step: 12-14 thousand preemptions of
the model's thread in 40 s of four streamed chats on the 2-core box. With them kept on the
reserved core (``taskset``, four alternating runs a side, a scratch client), the same load
streamed 85.0 chunks a second against 82.2, and the model's thread was preempted 10-12
thousand times (the client and the worker's own threads are the rest).

``APPLIANCE_SERVICE_CPUS`` says where those processes run: ``auto`` (the default) the cores vLLM
reserves, when the engine is vLLM's CPU build with its own binding, one engine on one NUMA node;
``off``: anywhere; or a list (``3``, ``2-3,6``). The ingest workers are not kept there: their
embedding runs in the idle CPU class while drafting runs (``APPLIANCE_INGEST_CPU_CLASS``) and
uses every core when nothing else does. The engine host keeps itself and the engine core there
once its engine is ready (``EngineHostCores``): started there, the model's worker would take its
binding from that one core.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

logger = logging.getLogger(__name__)

AUTO = "auto"
OFF = "off"
NODES_DIR = Path("/sys/devices/system/node")


def parse_cpu_list(text: str) -> frozenset[int]:
    """``"0-3,6"`` -> {0, 1, 2, 3, 6} (the kernel's and ``taskset``'s notation)."""
    cpus: set[int] = set()
    for part in text.replace("|", ",").split(","):
        part = part.strip()
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def service_cpus_for(
    setting: str,
    *,
    allowed: Iterable[int],
    engine_on_cpu: bool,
    engines: int,
    numa_nodes: int,
    omp_bind: str,
    reserved: str,
) -> frozenset[int] | None:
    """Where the appliance's serving processes run, None for anywhere; pure (``service_cpus``
    gives it this machine). ``omp_bind`` and ``reserved``: ``VLLM_CPU_OMP_THREADS_BIND`` and
    ``VLLM_CPU_NUM_OF_RESERVED_CPU`` as vLLM reads them ("" when unset)."""
    allowed = sorted(set(allowed))
    setting = setting.strip().lower()
    if setting == OFF or not setting:
        return None
    if setting != AUTO:
        return parse_cpu_list(setting) & frozenset(allowed) or None
    if not engine_on_cpu or engines != 1:
        return None
    bind = omp_bind.strip().lower()
    if bind in ("", AUTO):
        if numa_nodes != 1:
            return None  # vLLM binds the first node's cores; the rule below would be wrong
        count = int(reserved) if reserved.strip() else 1
        # vLLM reserves nothing when it would leave the model no core of its own.
        return frozenset(allowed[-count:]) if 0 < count < len(allowed) else None
    if bind in ("all", "nobind"):
        return None
    return frozenset(allowed) - parse_cpu_list(bind) or None  # the model's cores named outright


def _numa_nodes() -> int:
    return len(list(NODES_DIR.glob("node[0-9]*"))) or 1


def _vllm_cpu_build() -> bool:
    """vLLM's CPU build is installed (not the CUDA one), without importing it."""
    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def service_cpus(settings) -> frozenset[int] | None:
    """Where this machine's serving processes run (``APPLIANCE_SERVICE_CPUS``; ``auto`` for
    settings that do not say: a benchmark's pool caps), None for anywhere."""
    from appliance.supervisor import engine_slots

    return service_cpus_for(
        getattr(settings, "APPLIANCE_SERVICE_CPUS", AUTO),
        allowed=os.sched_getaffinity(0),
        engine_on_cpu=_vllm_cpu_build(),
        engines=len(engine_slots(settings)),
        numa_nodes=_numa_nodes(),
        omp_bind=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", ""),
        reserved=os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", ""),
    )


def keep(pid: int, cpus: frozenset[int]) -> None:
    """Every thread of ``pid`` on ``cpus`` (threads it starts later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, PermissionError):  # a thread that ended, or a foreign one
            pass


def keep_server(server, service: frozenset[int] | None) -> None:
    """An embedded server (Postgres's postmaster, Valkey: ``server_process()``, None when it is
    gone) on the service cores, if they are set: Postgres's backends and Valkey's threads start
    from it later and inherit them."""
    if service and server is not None:
        keep(server.pid, service)


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return children


def descendants(pid: int) -> list[int]:
    """``pid`` and every process it started, theirs and so on, each once, ``pid`` first."""
    found: list[int] = []
    pending = [pid]
    while pending:
        each = pending.pop()
        if each not in found:
            found.append(each)
            pending += _children(each)
    return found


class EngineHostCores:
    """The engine host's part: it starts its engine anywhere (vLLM takes the model's binding from
    the cores the engine core may use), and once the engine is ready keeps itself and what it
    started that vLLM left unbound (the engine core) on the service cores; what vLLM bound (the
    model's workers) keeps its cores."""

    def __init__(self, service: frozenset[int] | None) -> None:
        self.service = service
        self.allowed = frozenset(os.sched_getaffinity(0))  # before anything is kept anywhere

    def for_starting(self) -> None:
        """The calling thread, which is about to start an engine (again), on every core: the
        engine core inherits it."""
        if self.service:
            os.sched_setaffinity(0, self.allowed)

    def engine_ready(self) -> dict[str, list[int]]:
        """Keep the engine host and its engine core on the service cores; the cores of each, for
        the engine's description (a warning if the model's share any with the services)."""
        if not self.service:
            return {}
        model: set[int] = set()
        for pid in descendants(os.getpid()):
            try:
                own = os.sched_getaffinity(pid)
            except ProcessLookupError:
                continue
            if pid != os.getpid() and own not in (self.allowed, self.service):
                model |= own  # bound by vLLM
            else:  # this host, a new engine core, or one of its helpers kept here before a restart
                keep(pid, self.service)
        if model & self.service:
            logger.warning(
                "the model runs on cores %s, which the appliance's services share", sorted(model & self.service)
            )
        return {"service_cpus": sorted(self.service), "model_cpus": sorted(model)}
