"""Starts the tests' OpenID Connect provider (tests/directory/oidc_provider/) on a free port: its
own SQLite database and RSA signing key in a temporary folder, migrated and seeded, served by
Django's development server in a child process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from appliance.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID = "document-assistant"
CLIENT_SECRET = "the appliance's client secret at the provider"
USERS = {
    "erin": ("erin's provider password", ["legal-team"]),
    "frank": ("frank's provider password", ["finance-team", "appliance-admins"]),
}


@dataclass
class Provider:
    folder: Path
    port: int
    process: subprocess.Popen

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}/o"

    @property
    def discovery_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PROVIDER_DIR": str(self.folder),
            "DJANGO_SETTINGS_MODULE": "tests.directory.oidc_provider.settings",
            "PYTHONPATH": str(ROOT),
        }

    def ops(self, *args: str) -> None:
        subprocess.run(
            [sys.executable, "-m", "tests.directory.oidc_provider.ops", *args],
            cwd=ROOT,
            env=self.env(),
            check=True,
            capture_output=True,
        )

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def start_provider(redirect_uri: str) -> Provider:
    folder = Path(tempfile.mkdtemp(prefix="appliance-oidc-"))
    subprocess.run(["openssl", "genrsa", "-out", str(folder / "signing.key"), "2048"], check=True, capture_output=True)
    (folder / "users.json").write_text(json.dumps(USERS))
    provider = Provider(folder=folder, port=free_port(), process=None)  # type: ignore[arg-type]
    manage = [sys.executable, "-m", "django"]
    subprocess.run([*manage, "migrate", "--noinput"], cwd=ROOT, env=provider.env(), check=True, capture_output=True)
    provider.ops("seed", redirect_uri, CLIENT_ID, CLIENT_SECRET, str(folder / "users.json"))
    log = open(folder / "provider.log", "wb")  # noqa: SIM115 (the server's, closed with it)
    provider.process = subprocess.Popen(
        [*manage, "runserver", f"127.0.0.1:{provider.port}", "--noreload", "--nothreading"],
        cwd=ROOT,
        env=provider.env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(provider.discovery_url, timeout=2) as response:
                if json.load(response).get("issuer"):
                    return provider
        except OSError:
            pass
        if provider.process.poll() is not None or time.monotonic() > deadline:
            output = (folder / "provider.log").read_text(errors="replace")
            provider.stop()
            raise RuntimeError(f"the test OpenID Connect provider did not start: {output[-2000:]}")
        time.sleep(0.2)
