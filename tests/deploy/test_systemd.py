"""deploy/systemd/: the units of a cluster's nodes are valid to systemd, each runs the process the
one declaration has for its role (``manage.py process``), and the node environment examples set
only settings the appliance reads and give each node the processes its units name."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.manifests import (
    DEPLOY,
    commented_variables,
    environment_file,
    node_environment,
    resolve_processes,
    unknown_variables,
)

UNITS = DEPLOY / "systemd"
PYTHON = "/opt/appliance/.venv/bin/python"
SERVICES = sorted(path.name for path in UNITS.glob("*.service"))
EXAMPLES = [DEPLOY / "web-node.env.example", DEPLOY / "gpu-node.env.example"]
# The hardening a unit of the appliance keeps (deploy/appliance.service has the same).
HARDENING = {
    "User": "appliance",
    "NoNewPrivileges": "yes",
    "PrivateTmp": "yes",
    "ProtectSystem": "strict",
    "ReadWritePaths": "/opt/appliance/var",
    "ProtectHome": "yes",
    "Restart": "on-failure",
    "KillMode": "mixed",
}
# Each unit (an instance for templates) and the process of the declaration it must run.
INSTANCES = {
    "appliance-web.service": ("web", "web"),
    "appliance-beat.service": ("beat", "beat"),
    "appliance-worker@ingest.service": ("ingest", "ingest-worker"),
    "appliance-worker@prefill-0.service": ("prefill-0", "prefill-worker"),
    "appliance-worker@decode-1.service": ("decode-1", "decode-worker-1"),
    "appliance-engine@0.service": ("engine-0", "engine"),
    "appliance-engine@1.service": ("engine-1", "engine-1"),
}

# Installed by scripts/system-packages (Debian's systemd), as make test runs it.
systemd_analyze = shutil.which("systemd-analyze") or "systemd-analyze"


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # keys keep their case
    parser.read_string((UNITS / name).read_text(encoding="utf-8"))
    return parser


def template_of(instance: str) -> tuple[str, str]:
    """``appliance-worker@prefill-0.service`` -> (``appliance-worker@.service``, ``prefill-0``)."""
    if "@" not in instance:
        return instance, ""
    prefix, rest = instance.split("@", 1)
    name, _, suffix = rest.rpartition(".")
    return f"{prefix}@.{suffix}", name


def verify(directory: Path, names: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [systemd_analyze, "verify", "--man=no", *[str(directory / name) for name in names]],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def units_here(tmp_path: Path, edit=lambda text: text) -> Path:
    """The units, with the appliance's interpreter pointed at an executable here (systemd-analyze
    checks that ExecStart's program exists) and ``edit`` applied."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    folder = tmp_path / "units"
    folder.mkdir()
    for path in UNITS.iterdir():
        (folder / path.name).write_text(edit(path.read_text(encoding="utf-8").replace(PYTHON, str(python))))
    return folder


def test_the_cluster_units_are_there():
    assert SERVICES == [
        "appliance-beat.service",
        "appliance-engine@.service",
        "appliance-node.service",
        "appliance-web.service",
        "appliance-worker@.service",
    ]
    assert (UNITS / "appliance.target").exists()


def test_systemd_finds_nothing_wrong_with_the_units(tmp_path):
    folder = units_here(tmp_path)
    names = ["appliance.target", *SERVICES, *(name for name in INSTANCES if "@" in name)]
    result = verify(folder, names)
    # systemd-analyze exits 0 on a key it ignores; anything it says is a fault in a unit.
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr
    )


@pytest.mark.parametrize(
    ("name", "broken"),
    [
        ("appliance-worker@.service", ("KillMode=mixed", "KillMode=gently")),
        ("appliance-web.service", ("Restart=on-failure", "Restart=sometimes")),
        ("appliance-engine@.service", ("[Service]", "[Service]\nTimeoutStopSecs=60")),
    ],
)
def test_the_verification_fails_on_a_broken_unit(tmp_path, name, broken):
    folder = units_here(tmp_path)
    path = folder / name
    path.write_text(path.read_text().replace(*broken, 1))
    instance = name.replace("@.", "@0.")
    result = verify(folder, [instance])
    assert result.returncode != 0 or result.stderr.strip(), "a broken unit passed"
    assert name in result.stderr


@pytest.mark.parametrize("name", [*SERVICES])
def test_each_service_is_hardened_and_part_of_the_target(name):
    parsed = unit(name)
    service = parsed["Service"]
    for key, value in HARDENING.items():
        assert service.get(key) == value, f"{name}: {key}={service.get(key)}, not {value}"
    assert service.get("EnvironmentFile") == "/etc/appliance/appliance.env"
    assert int(service["TimeoutStopSec"]) > 0
    assert parsed["Unit"]["PartOf"] == "appliance.target"
    assert parsed["Install"]["WantedBy"] == "appliance.target"


def test_workers_drain_longer_than_the_web_server_stops():
    # A worker's SIGTERM lets its running jobs finish: its stop timeout is the longest.
    timeouts = {name: int(unit(name)["Service"]["TimeoutStopSec"]) for name in SERVICES}
    assert timeouts["appliance-worker@.service"] == max(timeouts.values()) >= 120


@pytest.mark.parametrize(("instance", "expected"), INSTANCES.items(), ids=list(INSTANCES))
def test_each_unit_runs_the_declared_process_for_its_role(instance, expected):
    template, instance_name = template_of(instance)
    argv = shlex.split(unit(template)["Service"]["ExecStart"])
    assert argv[:3] == [PYTHON, "manage.py", "process"], argv  # never a command line of its own
    process = argv[3].replace("%i", instance_name)
    assert process == expected[0]


def test_the_heartbeat_unit_announces_the_nodes_roles():
    assert shlex.split(unit("appliance-node.service")["Service"]["ExecStart"]) == [PYTHON, "manage.py", "announce_node"]
    for example in EXAMPLES:
        assert "APPLIANCE_ROLES" in environment_file(example), example.name


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_the_node_examples_set_only_settings_the_appliance_reads(example):
    names = [*environment_file(example), *commented_variables(example)]
    assert unknown_variables(names) == []
    # Secrets from files: nothing in an example is a password.
    values = environment_file(example)
    for secret in ("DATABASE_URL", "REDIS_URL", "APPLIANCE_SECRET_KEY", "APPLIANCE_ENGINE_TOKEN"):
        assert f"{secret}_FILE" in values and secret not in values, f"{example.name}: {secret}"


def test_the_units_of_a_web_node_resolve_to_its_processes(tmp_path):
    env = node_environment(environment_file(DEPLOY / "web-node.env.example"), tmp_path)
    out = resolve_processes(env, ["web", "ingest", "beat"])
    assert out["resolved"]["web"]["argv"] == out["declared"]["web"]["argv"]
    assert out["resolved"]["web"]["role"] == "web"
    assert out["resolved"]["ingest"]["argv"] == out["declared"]["ingest-worker"]["argv"]
    assert "-c" in out["resolved"]["ingest"]["argv"] and "2" in out["resolved"]["ingest"]["argv"]  # its cap
    # Beat schedules the sources' polls (APPLIANCE_SOURCE_TICK_S), directory sign-in or not.
    assert out["resolved"]["beat"]["argv"] == out["declared"]["beat"]["argv"]


def test_the_units_of_a_gpu_node_resolve_to_each_engine_slot(tmp_path):
    example = environment_file(DEPLOY / "gpu-node.env.example")
    env = node_environment(example, tmp_path)
    out = resolve_processes(env, [name for name, _ in INSTANCES.values()] + ["engine-2"])
    resolved, declared = out["resolved"], out["declared"]
    for unit_name, (process, declared_name) in INSTANCES.items():
        if process in ("web", "beat", "ingest"):
            continue
        assert resolved[process]["name"] == declared_name, unit_name
        assert resolved[process]["argv"] == declared[declared_name]["argv"]
        assert resolved[process]["env"] == declared[declared_name]["env"]
    # Two engines of two GPUs each, on their own sockets and ports; each slot's workers use its socket.
    assert resolved["engine-0"]["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert resolved["engine-1"]["env"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert resolved["engine-1"]["env"]["APPLIANCE_ENGINE_LISTEN"] == "0.0.0.0:8471"
    socket = resolved["engine-1"]["env"]["APPLIANCE_ENGINE_SOCKET"]
    assert resolved["decode-1"]["env"]["APPLIANCE_ENGINE_URL"] == f"unix:{socket}"
    assert "decode-1@%h" in resolved["decode-1"]["argv"]
    assert "APPLIANCE_ENGINES=2" in resolved["engine-2"]["error"]  # no third slot on this node


def test_the_web_node_example_passes_djangos_deploy_checks(tmp_path):
    import sys

    env = node_environment(environment_file(DEPLOY / "web-node.env.example"), tmp_path)
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=DEPLOY.parent, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
