"""The embedded Postgres and Valkey trust no one for being local: generated passwords, kept
owner-only under var/secrets/, asked of every connection (an attack probe against the suite's
own running services, and an older cluster made with ``trust`` brought under passwords)."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import psycopg
import pytest
import redis
from django.conf import settings

from appliance.credentials import EmbeddedCredentials, generated_secret
from appliance.embedded import EmbeddedPostgres, embedded_services, free_port


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_secrets_are_generated_once_and_kept_owner_only(tmp_path):
    first = generated_secret(tmp_path, "probe")
    assert len(first) >= 40 and generated_secret(tmp_path, "probe") == first
    assert _mode(tmp_path / "secrets") == 0o700 and _mode(tmp_path / "secrets" / "probe") == 0o600
    (tmp_path / "secrets" / "probe").chmod(0o644)  # copied carelessly
    assert generated_secret(tmp_path, "probe") == first
    assert _mode(tmp_path / "secrets" / "probe") == 0o600
    kept = [
        Path(settings.VAR_DIR) / "secrets" / name
        for name in ("postgres_superuser", "postgres_appliance", "valkey", "engine_token", "secret_key")
    ]
    for path in [*kept, Path(settings.VAR_DIR) / "secret_key"]:  # the last: where older versions kept it
        if path.exists():
            assert _mode(path) == 0o600, path


def test_the_suites_postgres_refuses_a_local_caller_without_the_password():
    postgres, _ = embedded_services(settings.VAR_DIR, settings.EMBEDDED_PG_PORT, settings.EMBEDDED_REDIS_PORT)
    for user, password in (("postgres", None), ("appliance", None), ("postgres", "guess"), ("appliance", "")):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(host="127.0.0.1", port=postgres.port, user=user, password=password, dbname="postgres",
                            connect_timeout=10)  # fmt: skip
    # Over its Unix socket too (no address to trust there either).
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(host=str(postgres.socket_dir), port=postgres.port, user="postgres", dbname="postgres",
                        connect_timeout=10)  # fmt: skip
    with postgres.connect(superuser=False) as conn:  # the appliance's own role, with its password
        assert conn.execute("SELECT current_user").fetchone() == ("appliance",)
    rules = [line.split() for line in (postgres.data_dir / "pg_hba.conf").read_text().splitlines()
             if line.strip() and not line.startswith("#")]  # fmt: skip
    assert rules and all(rule[-1] == "scram-sha-256" for rule in rules), rules


def test_the_suites_valkey_refuses_a_local_caller_without_the_password():
    _, valkey = embedded_services(settings.VAR_DIR, settings.EMBEDDED_PG_PORT, settings.EMBEDDED_REDIS_PORT)
    stranger = redis.Redis(host="127.0.0.1", port=valkey.port, socket_timeout=5)
    with pytest.raises(redis.AuthenticationError):
        stranger.lpush("decode", "an injected task")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=valkey.port, password="guess", socket_timeout=5).ping()
    assert valkey.client(socket_timeout=5).ping()
    # The password is in an owner-only file, not on the server's command line (which /proc shows
    # to every local user).
    assert _mode(valkey.config_path) == 0o600
    server = valkey.server_process()
    assert server is not None
    cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes()
    assert valkey.credentials.valkey.encode() not in cmdline


def test_a_cluster_an_older_version_made_with_trust_is_put_under_passwords():
    base = Path(settings.VAR_DIR) / f"trust-{os.getpid()}"  # where the server's user may reach it
    shutil.rmtree(base, ignore_errors=True)
    credentials = EmbeddedCredentials.of(base)
    postgres = EmbeddedPostgres(data_dir=base / "postgres" / "data", port=free_port(), credentials=credentials)
    # What the older version did: initdb with --auth=trust, then its role with no password.
    postgres.data_dir.mkdir(parents=True)
    postgres.socket_dir.mkdir(parents=True)
    postgres._prepare_permissions()
    postgres._pg("initdb", "-D", str(postgres.data_dir), "--auth=trust", "--encoding=UTF8", "--locale=C",
                 "-U", "postgres")  # fmt: skip
    assert "trust" in (postgres.data_dir / "pg_hba.conf").read_text()
    try:
        assert postgres.start()
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(host="127.0.0.1", port=postgres.port, user="postgres", dbname="postgres",
                            connect_timeout=10)  # fmt: skip
        with psycopg.connect(postgres.url(), connect_timeout=10) as conn:
            assert conn.execute("SELECT extname FROM pg_extension WHERE extname = 'vector'").fetchone()
        # And again after a restart, with nothing left to change.
        postgres.stop()
        assert postgres.start()
        with psycopg.connect(postgres.url(), connect_timeout=10) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        postgres.stop()
        shutil.rmtree(base, ignore_errors=True)
