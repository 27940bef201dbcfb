"""A process's database connections: a pool per process (psycopg_pool, Django's ``pool`` option;
``APPLIANCE_DB_POOL_MAX_SIZE`` in README.md).

A request or a job takes a connection when it first queries and gives it back when it ends
(Django closes a request's connections; Celery's Django fixup a task's), so no job waits for a
new backend to start; the pool checks a connection before handing it out, so those a database
restart broke are dropped (each after a pause that grows 1, 2, 4 s: the first requests after a
restart may wait a few seconds). Two cases are handled here: Celery's prefork pool, whose
children would each build and tear down a pool around every task, and a command that has
finished with the database but keeps running.
"""

from __future__ import annotations

import os

import psycopg


def direct_connection(timeout_s: float) -> psycopg.Connection:
    """A connection of its own, outside the pool, with the settings' parameters (autocommit;
    close it). For a check that must fail at once, with the server's own reason: a pooled
    request waits out the pool's timeout while the database refuses, and then says only that."""
    from django.db import connection

    return psycopg.connect(**{**connection.get_connection_params(), "connect_timeout": timeout_s}, autocommit=True)


def unpooled_in_prefork_worker(pool_cls) -> bool:
    """For a Celery worker whose pool is ``pool_cls`` (a name or a class): a prefork worker's
    children open a connection per task instead of a pool (Celery's Django fixup closes a
    prefork child's pool after every task, so a pool would only add threads and a second
    connection). Changes the settings in place, before any connection exists; True if it did."""
    name = pool_cls if isinstance(pool_cls, str) else getattr(pool_cls, "__module__", "")
    if "prefork" not in name:
        return False
    from django.conf import settings

    changed = False
    for database in settings.DATABASES.values():
        if database.get("OPTIONS", {}).pop("pool", None):
            database["CONN_HEALTH_CHECKS"] = True
            changed = True
    return changed


def close_pool() -> None:
    """Give back this process's pooled connections (a command that has finished with the
    database but keeps running, such as ``serve``)."""
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        connection.close()
        close = getattr(connection, "close_pool", None)  # the psycopg backend's, when pooled
        if close is not None and getattr(connection, "pool", None) is not None:
            close()


def local_backend(settings_dict: dict) -> bool:
    """Whether a database's backends are processes of this machine: a Unix socket or a loopback
    address (a PID another machine gave means nothing here)."""
    from inference.engine.address import is_loopback

    host = settings_dict.get("HOST") or ""
    return host == "" or host.startswith("/") or is_loopback(host)


def share_niceness(connection, niceness: int) -> bool:
    """Runs the Postgres backend that serves ``connection`` (a Django connection wrapper, open) at
    ``niceness``, if it is a process of this machine that this process may renice: the queries of
    background work (the ingest worker's writes and index updates) then yield the CPU as the
    worker itself does, instead of competing at full priority with the drafters' job claims.
    True if it did; anything else (a remote server, a backend of another user) is left as it is."""
    if not local_backend(connection.settings_dict):
        return False
    pid = connection.connection.info.backend_pid
    try:
        with open(f"/proc/{pid}/comm") as comm:  # only ever a Postgres process
            if comm.read().strip() != "postgres":
                return False
        if os.getpriority(os.PRIO_PROCESS, pid) != niceness:
            os.setpriority(os.PRIO_PROCESS, pid, niceness)
    except OSError:  # gone, or not ours to renice
        return False
    return True
