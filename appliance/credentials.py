"""Secrets the appliance generates for itself, kept under ``var/secrets/`` (owner-only).

The embedded Postgres and Valkey listen on loopback, but loopback is every process on the box:
the document-parsing child, another user's shell, a compromised tool. So they are not trusted
by address: Postgres asks for a password (scram-sha-256) and Valkey for its ``requirepass``, each
generated on first use and read by every process of the appliance from these files. The engine
host's socket takes a token from here too (``engine_token``).

Files are written once, atomically (a second process starting at the same moment reads the
first one's value, never half of it), with mode 0600 in a 0700 directory. Production, which
sets ``DATABASE_URL`` and ``REDIS_URL``, carries its own credentials in them (``*_FILE``).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

SECRETS_DIR = "secrets"


def secrets_dir(var_dir: Path) -> Path:
    directory = Path(var_dir) / SECRETS_DIR
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    if directory.stat().st_mode & 0o077 and directory.stat().st_uid == os.geteuid():
        directory.chmod(0o700)
    return directory


def generated_secret(var_dir: Path, name: str, *, nbytes: int = 32) -> str:
    """The secret ``name`` under ``var_dir/secrets/``, generated on first use from ``nbytes``
    random bytes."""
    directory = secrets_dir(var_dir)
    path = directory / name
    existing = _read(path)
    if existing:
        return existing
    value = secrets.token_urlsafe(nbytes)
    temporary = directory / f".{name}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, value.encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temporary, path)  # atomic, and refuses to replace what another process wrote first
    except FileExistsError:
        value = _read(path) or value
    finally:
        temporary.unlink(missing_ok=True)
    return value


class SecretUnreadable(RuntimeError):
    pass


def _read(path: Path) -> str:
    try:
        if path.stat().st_mode & 0o077 and path.stat().st_uid == os.geteuid():
            path.chmod(0o600)  # an older install's, or a copy made carelessly
        return path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return ""
    except PermissionError as exc:
        raise SecretUnreadable(
            f"{path} cannot be read by this user (uid {os.geteuid()}): it was made by another (was a manage.py "
            f"command run as root?). Run the appliance's commands as its own user, or give it the file: "
            f"chown -R <appliance user> {path.parent}"
        ) from exc


@dataclass(frozen=True)
class EmbeddedCredentials:
    """The passwords of the embedded services of one ``var`` directory."""

    postgres_superuser: str  # the cluster's ``postgres`` role: only the appliance's own bootstrap uses it
    postgres_appliance: str  # the ``appliance`` role every process connects as
    valkey: str

    @classmethod
    def of(cls, var_dir: Path) -> EmbeddedCredentials:
        return cls(
            postgres_superuser=generated_secret(var_dir, "postgres_superuser"),
            postgres_appliance=generated_secret(var_dir, "postgres_appliance"),
            valkey=generated_secret(var_dir, "valkey"),
        )
