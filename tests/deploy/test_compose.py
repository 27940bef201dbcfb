"""deploy/compose/: the Compose file is valid against the Compose specification's JSON schema (as
``docker compose config`` would check it, with no Docker here), each service runs a process of the
one declaration, sets only settings the appliance reads and takes its secrets from files, a GPU
node's engine reserves GPUs, and the image installs from the lock files."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest
import yaml
from jsonschema import Draft202012Validator

from tests.deploy.manifests import ROOT, commented_variables, environment_file, unknown_variables

COMPOSE = ROOT / "deploy" / "compose"
SECRETS = {"DATABASE_URL", "REDIS_URL", "APPLIANCE_SECRET_KEY", "APPLIANCE_ENGINE_TOKEN"}
_VARIABLE = re.compile(r"\$\{(?P<name>[A-Z_][A-Z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}")


def compose_schema() -> dict:
    """The compose-spec schema (Apache-2.0, github.com/compose-spec/compose-spec), as vendored in
    the check-jsonschema wheel with its licence."""
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    assert "Apache License" in (vendor / "licenses" / "LICENSE.compose-spec").read_text()
    return json.loads((vendor / "compose-spec.json").read_text())


def interpolate(text: str, variables: dict[str, str]) -> str:
    """Compose's ${NAME}, ${NAME:-default} and ${NAME:?message}, with ``variables`` as the shell's."""

    def one(match: re.Match) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        value = variables.get(name)
        if op in (":-", "-"):
            return value if value else arg
        if op in (":?", "?"):
            assert value, f"{name} is required: {arg}"
            return value
        return value or ""

    return _VARIABLE.sub(one, text.replace("$$", "\0")).replace("\0", "$")


def compose(variables: dict[str, str] | None = None) -> dict:
    return yaml.safe_load(interpolate((COMPOSE / "compose.yaml").read_text(encoding="utf-8"), variables or {}))


def services(profile: str) -> dict[str, dict]:
    return {name: svc for name, svc in compose()["services"].items() if profile in svc.get("profiles", [])}


def test_the_file_is_valid_against_the_compose_specification():
    validator = Draft202012Validator(compose_schema())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose())]
    assert errors == []


def test_the_schema_check_finds_a_broken_file():
    broken = compose()
    broken["services"]["web"]["restart"] = ["always"]  # a string, not a list
    broken["services"]["engine"]["deploy"]["resources"]["reservations"]["gpus"] = "all"  # no such key
    broken["services"]["decode"]["stop_grace_periods"] = "30s"
    errors = list(Draft202012Validator(compose_schema()).iter_errors(broken))
    assert len(errors) >= 3


def test_a_web_node_and_gpu_nodes():
    assert sorted(services("web")) == ["beat", "ingest", "node-web", "web"]
    assert sorted(services("gpu")) == ["decode", "engine", "node-gpu", "prefill"]
    assert all(svc.get("profiles") for svc in compose()["services"].values())  # nothing starts on both


def test_every_service_runs_the_one_image_built_from_the_repository():
    for name, svc in compose()["services"].items():
        assert svc["image"] == "document-appliance:latest", name
        assert svc["build"]["context"] == "../.." and svc["build"]["dockerfile"] == "deploy/compose/Dockerfile", name


def test_each_service_runs_a_declared_process_or_the_heartbeat():
    from appliance.management.commands.process import _NAME

    commands = {name: svc["command"] for name, svc in compose()["services"].items()}
    assert commands == {
        "web": ["process", "web"],
        "beat": ["process", "beat"],
        "ingest": ["process", "ingest"],
        "node-web": ["announce_node"],
        "engine": ["process", "engine-0"],
        "prefill": ["process", "prefill-0"],
        "decode": ["process", "decode-0"],
        "node-gpu": ["announce_node"],
    }
    for command in commands.values():
        if command[0] == "process":
            assert _NAME.match(command[1]), command  # a name `manage.py process` resolves


def test_the_services_set_only_settings_the_appliance_reads_and_secrets_from_files():
    file = compose()
    for name, svc in file["services"].items():
        environment = svc.get("environment", {})
        assert unknown_variables(environment) == [], name
        assert not SECRETS & set(environment), name
        for secret in SECRETS:
            path = environment[f"{secret}_FILE"]
            assert path.startswith("/run/secrets/") and path.rsplit("/", 1)[1] in svc["secrets"], (name, secret)
        assert svc["env_file"] == ["appliance.env"]
    assert set(file["secrets"]) == {"database_url", "redis_url", "secret_key", "engine_token"}
    example = COMPOSE / "appliance.env.example"
    assert unknown_variables([*environment_file(example), *commented_variables(example)]) == []
    assert not SECRETS & set(environment_file(example))


def test_the_roles_each_node_announces_are_the_processes_it_runs():
    web, gpu = services("web"), services("gpu")
    assert web["node-web"]["environment"]["APPLIANCE_ROLES"] == "web,ingest"
    assert gpu["node-gpu"]["environment"]["APPLIANCE_ROLES"] == "engine,prefill,decode"


def test_the_gpu_node_engine_reserves_its_gpus_and_shares_its_socket_with_its_workers():
    gpu = compose({"DEPLOY_GPUS": "2,3"})["services"]
    devices = gpu["engine"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "device_ids": ["2,3"], "capabilities": ["gpu"]}]
    socket_volume = "engine-run:/var/lib/appliance/run"  # where var/run/engine.sock is
    for name in ("engine", "prefill", "decode", "node-gpu"):
        assert socket_volume in gpu[name]["volumes"], name
    assert not any("deploy" in gpu[name] for name in ("prefill", "decode", "node-gpu"))  # workers take no GPU


def test_the_web_server_and_the_ingest_worker_share_the_uploads():
    web = services("web")
    assert "data:/var/lib/appliance" in web["web"]["volumes"]
    assert "data:/var/lib/appliance" in web["ingest"]["volumes"]
    assert web["web"]["environment"]["APPLIANCE_WEB_HOST"] == "0.0.0.0"  # reachable in its container
    assert web["web"]["ports"] == ["127.0.0.1:8000:8000"]  # but only from the host's proxy


def test_workers_get_time_to_drain():
    file = compose()["services"]
    for name in ("ingest", "prefill", "decode"):
        assert file[name]["stop_grace_period"] == "300s", name


# --- The image -----------------------------------------------------------------------------


def dockerfile_instructions() -> list[str]:
    text = (COMPOSE / "Dockerfile").read_text(encoding="utf-8")
    joined = re.sub(r"\\\n", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_the_image_installs_from_the_lock_files_as_make_install_does():
    instructions = dockerfile_instructions()
    assert instructions[0].startswith("FROM python:3.11-") and "bookworm" in instructions[0]  # Python 3.11, Debian 12
    runs = [line for line in instructions if line.startswith("RUN ")]
    install = [line for line in runs if "scripts/install.py" in line]
    assert len(install) == 1, runs
    assert '--device "$APPLIANCE_DEVICE"' in install[0] and "--wheelhouse" in install[0]
    assert not any(re.search(r"pip3? install|uv pip|requirements\.in", line) for line in runs), runs  # nothing unlocked
    copied = " ".join(line for line in instructions if line.startswith("COPY "))
    assert "requirements/" in copied and "scripts/" in copied
    # scripts/install.py installs requirements/<device>.txt and model.txt, hash-checked, no deps.
    installer = (ROOT / "scripts" / "install.py").read_text()
    assert "--require-hashes" in installer and "model.txt" in installer


def test_the_image_holds_every_package_of_the_project():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [pattern.rstrip("*") for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    copied = {line.split()[1].rstrip("/") for line in dockerfile_instructions() if line.startswith("COPY ")}
    missing = [name for name in [*packages, "templates", "static"] if name not in copied]
    assert missing == [], f"the Dockerfile does not copy {missing}"
    # What building the project itself reads (pip install -e: its metadata names the readme).
    files = {word for line in dockerfile_instructions() if line.startswith("COPY ") for word in line.split()[1:-1]}
    assert {"pyproject.toml", project["project"]["readme"], "manage.py"} <= files


def test_the_image_runs_as_the_appliances_user_a_declared_process():
    instructions = dockerfile_instructions()
    assert "USER appliance" in instructions
    assert 'ENTRYPOINT ["/opt/appliance/.venv/bin/python", "manage.py"]' in instructions
    assert 'CMD ["process", "web"]' in instructions
    env = " ".join(line for line in instructions if line.startswith("ENV "))
    names = re.findall(r"([A-Z_][A-Z0-9_]*)=", env)
    assert names and unknown_variables(names) == []


@pytest.mark.parametrize("ignored", [".git", ".venv", "var", "deploy/compose/secrets"])
def test_the_build_context_leaves_out_what_must_not_be_in_an_image(ignored):
    lines = (COMPOSE / "Dockerfile.dockerignore").read_text().splitlines()
    assert ignored in lines
    assert "wheelhouse" not in lines  # read through the bind mount for an install with no index


def test_what_the_image_copies_is_enough_to_build_the_project(tmp_path):
    """The install's last step builds the project from what the COPY lines put in the image
    (pip install -e, no build isolation): the same build, here, from those files alone."""
    import shutil
    import subprocess
    import sys

    source = tmp_path / "opt-appliance"
    source.mkdir()
    for line in dockerfile_instructions():
        if not line.startswith("COPY "):
            continue
        *sources, destination = [word for word in line.split()[1:] if not word.startswith("--")]
        for name in sources:
            origin = ROOT / name.rstrip("/")
            target = source / destination / origin.name if destination == "./" else source / destination.rstrip("/")
            if origin.is_dir():
                shutil.copytree(origin, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(origin, target)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--wheel-dir", str(tmp_path / "wheels"), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (wheel,) = (tmp_path / "wheels").glob("document_appliance-*.whl")
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "appliance/management/commands/process.py" in names
    assert "inference/engine/host.py" in names
