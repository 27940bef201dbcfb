"""``manage.py check --deploy`` is clean with the production environment example
(``deploy/appliance.env.example``), read as systemd reads an EnvironmentFile."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]


def environment_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (values may hold spaces), comments and blank lines skipped."""
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def test_the_production_example_passes_djangos_deploy_checks(tmp_path):
    example = environment_file(BASE_DIR / "deploy" / "appliance.env.example")
    assert example["APPLIANCE_TLS"] == "true"
    secret = tmp_path / "secret_key"
    secret.write_text(secrets.token_urlsafe(64))
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        **example,
        "APPLIANCE_SECRET_KEY_FILE": str(secret),
        "APPLIANCE_VAR_DIR": str(tmp_path / "var"),
        "DJANGO_SETTINGS_MODULE": "appliance.settings",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
