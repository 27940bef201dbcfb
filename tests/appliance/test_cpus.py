"""The serving processes kept off a CPU engine's model cores (``appliance.cpus``): the rule as
pure logic, then real processes and their real affinity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from appliance import cpus
from appliance.processes import start, stop_groups
from appliance.supervisor import appliance_processes


def rule(setting="auto", *, allowed=range(4), engine_on_cpu=True, engines=1, numa_nodes=1, omp_bind="", reserved=""):
    return cpus.service_cpus_for(
        setting, allowed=allowed, engine_on_cpu=engine_on_cpu, engines=engines, numa_nodes=numa_nodes,
        omp_bind=omp_bind, reserved=reserved,
    )  # fmt: skip


def test_auto_keeps_the_services_on_the_cores_vllm_reserves_beside_its_model():
    assert rule() == {3}  # vLLM's model takes 0-2 and leaves the last core
    assert rule(allowed=[4, 9, 2]) == {9}  # the last of the cores this process may use
    assert rule(omp_bind="auto", reserved="2") == {2, 3}  # VLLM_CPU_NUM_OF_RESERVED_CPU
    assert rule(omp_bind="0-1") == {2, 3}  # the model's cores named outright: the rest
    assert rule(omp_bind="0-1|2") == {3}  # one list per tensor-parallel rank


@pytest.mark.parametrize(
    "why",
    [
        {"engine_on_cpu": False},  # a GPU engine: its model is not on these cores
        {"engines": 2},
        {"numa_nodes": 2},  # vLLM binds by node there; not guessed
        {"allowed": [0]},  # one core: vLLM reserves none
        {"reserved": "4"},
        {"omp_bind": "nobind"},
        {"omp_bind": "all"},
    ],
)
def test_auto_leaves_the_services_anywhere_where_the_models_cores_are_not_known(why):
    assert rule(**why) is None


def test_a_list_is_taken_as_written_within_the_cores_allowed_and_off_is_anywhere():
    assert rule("1,3-4", engine_on_cpu=False) == {1, 3}
    assert rule("7", allowed=range(2)) is None
    assert rule("off") is None and rule("OFF") is None
    assert cpus.parse_cpu_list("0-2, 5") == {0, 1, 2, 5}


def test_the_serving_processes_are_declared_on_the_service_cores_and_the_engine_and_ingest_not(settings):
    settings.APPLIANCE_SERVICE_CPUS = "0"
    specs = {spec.name: spec for spec in appliance_processes(python=sys.executable, port=1, settings=settings)}
    assert {name for name, spec in specs.items() if spec.cpus == {0}} >= {"web", "decode-worker", "prefill-worker"}
    assert specs["engine"].cpus is None and specs["ingest-worker"].cpus is None
    settings.APPLIANCE_SERVICE_CPUS = "off"
    assert all(spec.cpus is None for spec in appliance_processes(python=sys.executable, port=1, settings=settings))


def _affinities(pid: int) -> list[set[int]]:
    return [os.sched_getaffinity(int(task.name)) for task in Path(f"/proc/{pid}/task").iterdir()]


def test_a_process_started_on_cores_keeps_them_in_every_thread_it_starts(tmp_path):
    one = frozenset({max(os.sched_getaffinity(0))})
    script = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); print('up', flush=True); time.sleep(60)"
    process = start([sys.executable, "-c", script], cwd=tmp_path, env=os.environ, log_path=tmp_path / "log", cpus=one)
    try:
        deadline = time.monotonic() + 30
        while "up" not in (tmp_path / "log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_affinities(process.pid)) == 2 and all(each == one for each in _affinities(process.pid))
        # Kept elsewhere later (a server the supervisor started earlier): every thread moves.
        everywhere = frozenset(os.sched_getaffinity(0))
        cpus.keep(process.pid, everywhere)
        assert all(each == everywhere for each in _affinities(process.pid))
    finally:
        stop_groups([process], timeout_s=10)


def test_the_engine_host_keeps_itself_and_its_engine_core_off_the_models_cores(engine_host):
    from django.conf import settings

    stats = engine_host.stats()
    service = cpus.service_cpus(settings)
    if service is None:  # one core, or no CPU engine: nothing is kept anywhere, and nothing said
        assert stats.get("service_cpus") is None and stats.get("model_cpus") is None
        return
    assert stats["service_cpus"] == sorted(service) and stats["model_cpus"]
    assert not set(stats["model_cpus"]) & service
    host = stats["pid"]
    assert all(each == service for each in _affinities(host))
    engine_core = [int(c) for t in Path(f"/proc/{host}/task").iterdir() for c in (t / "children").read_text().split()]
    names = {pid: Path(f"/proc/{pid}/comm").read_text().strip() for pid in engine_core}
    assert any(name.startswith("VLLM::EngineCor") for name in names.values())
    for pid, name in names.items():
        if name.startswith("VLLM::EngineCor"):
            assert all(each == service for each in _affinities(pid))
    model = subprocess.run(["pgrep", "-P", ",".join(map(str, engine_core))], capture_output=True, text=True).stdout
    assert any(os.sched_getaffinity(int(pid)) == set(stats["model_cpus"]) for pid in model.split())


# A stand-in engine host (named as such): a child process that starts an "engine core" (a
# sleeping grandchild left on every core, as vLLM leaves its engine core) which starts a "model
# worker" bound to the first core, as vLLM binds its model. The real engine host is checked above,
# where the test session runs vLLM's own binding (`VLLM_CPU_OMP_THREADS_BIND=auto make test`);
# the suite's default binds the model to every core and leaves nothing to keep.
STAND_IN_HOST = """
import json, os, subprocess, sys, time
from appliance import cpus
service, model = frozenset({int(sys.argv[1])}), frozenset({int(sys.argv[2])})
host = cpus.EngineHostCores(service)
worker = "import os, time; os.sched_setaffinity(0, {%s}); time.sleep(60)" % sys.argv[2]
core = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {worker!r}]); time.sleep(60)"])
while len(cpus.descendants(core.pid)) < 2 or os.sched_getaffinity(cpus.descendants(core.pid)[1]) != model:
    time.sleep(0.05)
described = host.engine_ready()
after = {"host": sorted(os.sched_getaffinity(0)), "core": sorted(os.sched_getaffinity(core.pid)),
         "worker": sorted(os.sched_getaffinity(cpus.descendants(core.pid)[1])), "described": described}
host.for_starting()  # about to start an engine again: on every core, for the new engine core to inherit
after["host_restarting"] = sorted(os.sched_getaffinity(0))
for pid in reversed(cpus.descendants(core.pid)):
    os.kill(pid, 9)
print(json.dumps(after))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a model core and a service core need two cores")
def test_the_engine_host_keeps_itself_and_its_engine_core_on_the_service_cores_and_the_model_on_its_own():
    allowed = sorted(os.sched_getaffinity(0))
    model, service = allowed[0], allowed[-1]
    out = subprocess.run(
        [sys.executable, "-c", STAND_IN_HOST, str(service), str(model)],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    after = json.loads(out.stdout.splitlines()[-1])
    assert after["host"] == [service] and after["core"] == [service]  # kept off the model's core
    assert after["worker"] == [model]  # what vLLM bound keeps its core
    assert after["described"] == {"service_cpus": [service], "model_cpus": [model]}
    assert after["host_restarting"] == allowed  # a new engine core is started from every core
