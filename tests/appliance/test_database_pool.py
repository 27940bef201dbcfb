"""Each process keeps a pool of database connections: a request or a job takes one and gives it
back, so none waits for a new backend to start, and one that was broken meanwhile is replaced."""

import pytest
from django.db import connection


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _pids_of_cycles(cycles: int) -> list[int]:
    """Backend of each of ``cycles`` request-like uses, each ending as a request or task does."""
    pids = []
    for _ in range(cycles):
        pids.append(_backend_pid())
        connection.close()  # what the end of a request (or Celery's task_postrun) does
    return pids


@pytest.mark.django_db(transaction=True)
def test_connections_are_reused_across_requests():
    assert connection.pool is not None
    pids = _pids_of_cycles(12)
    assert len(set(pids)) <= connection.pool.get_stats()["pool_size"] < len(pids), pids


@pytest.mark.django_db(transaction=True)
def test_a_connection_broken_while_pooled_is_replaced_not_handed_out():
    pooled = set(_pids_of_cycles(6))
    assert len(pooled) >= 2  # the pool hands its connections out in turn
    with connection.cursor() as cursor:  # the appliance's role may end its own backends
        mine = _backend_pid()
        for pid in pooled - {mine}:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    connection.close()
    # The one that ran the statements goes back healthy; the others are checked and dropped.
    after = _pids_of_cycles(6)
    assert not (set(after) & (pooled - {mine})), (pooled, after)


def test_a_refused_login_is_reported_at_once_with_the_servers_reason(monkeypatch):
    """The pool would wait out its timeout and then say only "couldn't get a connection"; the
    check (/healthz, /metrics, make run's start) asks on a connection of its own."""
    import time

    from appliance.health import check_database

    monkeypatch.setitem(connection.settings_dict, "PASSWORD", "not-the-password")
    started = time.monotonic()
    result = check_database()
    assert result["ok"] is False
    assert "password authentication failed" in result["detail"]
    assert time.monotonic() - started < connection.settings_dict["OPTIONS"]["pool"]["timeout"]


def test_a_prefork_worker_opens_a_connection_per_task_instead_of_a_pool(settings):
    """Celery's Django fixup closes a prefork child's pool after every task: there the pool is
    taken out of the settings before any connection exists; a threads worker keeps it."""
    import copy

    from appliance.database import unpooled_in_prefork_worker

    settings.DATABASES = copy.deepcopy(settings.DATABASES)
    assert unpooled_in_prefork_worker("threads") is False
    assert "pool" in settings.DATABASES["default"]["OPTIONS"]
    assert unpooled_in_prefork_worker("prefork") is True
    assert "pool" not in settings.DATABASES["default"]["OPTIONS"]
    assert settings.DATABASES["default"]["CONN_HEALTH_CHECKS"] is True


@pytest.mark.django_db(transaction=True)
def test_a_connections_backend_takes_the_niceness_it_is_given_only_on_this_machine():
    """share_niceness renices the local Postgres process serving a connection (the ingest worker's
    backends yield the CPU as it does); a server on another machine is left alone."""
    import os

    from appliance.database import local_backend, share_niceness

    pid = _backend_pid()
    try:
        assert share_niceness(connection, 7) is True
        assert os.getpriority(os.PRIO_PROCESS, pid) == 7
    finally:
        os.setpriority(os.PRIO_PROCESS, pid, 0)  # root here: the suite's backend gets its priority back
    assert local_backend({"HOST": "127.0.0.1"}) and local_backend({"HOST": "/run/postgresql"})
    assert local_backend({"HOST": ""}) and not local_backend({"HOST": "db.example.org"})
    remote = type("Remote", (), {"settings_dict": {"HOST": "10.0.0.5"}})()  # a fake: never connected
    assert share_niceness(remote, 7) is False
