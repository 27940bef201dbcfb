"""What the tests of deploy/ share: where the manifests are, the environment variables the
appliance really reads (so that a manifest setting one it does not read fails), and reading an
environment file as systemd and Compose do."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PRODUCT_PACKAGES = ("appliance", "documents", "inference", "console", "api", "directory", "measure")

# Every setting goes through appliance.env (env_str and the typed readers built on it).
_READ = re.compile(r"\benv_(?:str|bool|int|float|list|choice)\(\s*\"([A-Z][A-Z0-9_]*)\"")
# Read by what the appliance runs rather than by its own code, and set on purpose in deploy/.
LIBRARY_VARIABLES = {
    "HF_HUB_OFFLINE": "huggingface_hub: never download (the Makefile sets it too)",
    "XDG_CACHE_HOME": "where caches go: under var/, the one place a unit may write",
    "VLLM_CACHE_ROOT": "vLLM's compiled graphs",
    "TRITON_CACHE_DIR": "Triton's kernels",
    "DJANGO_SETTINGS_MODULE": "Django: which settings module",
    "PYTHONUNBUFFERED": "Python: logs reach the container runtime as they are written",
}


@cache
def appliance_variables() -> frozenset[str]:
    """The names the appliance reads with appliance.env, found in its source."""
    names: set[str] = set()
    for package in PRODUCT_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            names.update(_READ.findall(path.read_text(encoding="utf-8")))
    return frozenset(names)


def unknown_variables(names) -> list[str]:
    """The names in ``names`` that neither the appliance (``NAME`` or ``NAME_FILE``, which
    appliance.env reads for every setting) nor a library it runs reads."""
    known = appliance_variables()
    unknown = []
    for name in names:
        base = name.removesuffix("_FILE")
        if name in known or (name.endswith("_FILE") and base in known) or name in LIBRARY_VARIABLES:
            continue
        unknown.append(name)
    return sorted(unknown)


def environment_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (values may hold spaces), comments and blank lines skipped."""
    values = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def commented_variables(path: Path) -> list[str]:
    """The names of ``#NAME=value`` lines: settings an example shows but leaves off."""
    return re.findall(r"^#([A-Z][A-Z0-9_]*)=", path.read_text(encoding="utf-8"), flags=re.MULTILINE)


# Run in a fresh interpreter with a node's environment: the settings module reads it at import.
_RESOLVE = """
import json, sys
import django
django.setup()
from django.conf import settings
from appliance.management.commands.process import NoSuchProcess, declared_process
from appliance.supervisor import ROLES, appliance_processes
out = {"declared": {s.name: {"argv": s.argv, "env": s.env, "role": s.role}
                    for s in appliance_processes(python="PYTHON", port=settings_port, settings=settings, roles=ROLES)},
       "resolved": {}}
for name in json.loads(sys.argv[1]):
    try:
        spec = declared_process(name, settings=settings, python="PYTHON", port=settings_port)
        out["resolved"][name] = {"name": spec.name, "argv": spec.argv, "env": spec.env, "role": spec.role}
    except NoSuchProcess as exc:
        out["resolved"][name] = {"error": str(exc)}
print(json.dumps(out))
"""


def node_environment(example: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """An example's settings as a node would have them, with each ``_FILE`` it names written under
    ``tmp_path`` (a URL where the setting is one) and var/ there too."""
    import os
    import secrets

    values = {
        "DATABASE_URL": "postgresql://appliance:secret@db.example.internal:5432/appliance",
        "REDIS_URL": "redis://:secret@redis.example.internal:6379/0",
    }
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "DJANGO_SETTINGS_MODULE": "appliance.settings"}
    for key, value in example.items():
        if key.endswith("_FILE"):
            secret = tmp_path / "secrets" / key.lower()
            secret.parent.mkdir(exist_ok=True)
            secret.write_text(values.get(key.removesuffix("_FILE"), secrets.token_urlsafe(48)))
            value = str(secret)
        env[key] = value
    env["APPLIANCE_VAR_DIR"] = str(tmp_path / "var")
    return env


def resolve_processes(env: dict[str, str], names: list[str]) -> dict:
    """``manage.py process``'s resolution of ``names`` and the whole declaration, under ``env``."""
    import json
    import subprocess
    import sys

    port = env.get("APPLIANCE_PORT", "8000")
    script = _RESOLVE.replace("settings_port", port)
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(names)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
