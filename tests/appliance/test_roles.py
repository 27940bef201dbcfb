"""Node roles on the one declaration of the appliance's processes (``manage.py serve --roles``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from appliance.supervisor import ROLES, AlreadyServing, RolesError, ServeLock, appliance_processes, parse_roles


def test_all_or_nothing_given_is_every_role():
    assert parse_roles(None) == ROLES == parse_roles("all") == parse_roles(" ALL ")
    assert set(ROLES) == {"engine", "ingest", "prefill", "decode", "web"}


def test_roles_are_read_in_any_order_and_case_and_kept_in_starting_order():
    assert parse_roles("web, Ingest") == ("ingest", "web")
    assert parse_roles("decode,prefill,engine,") == ("engine", "prefill", "decode")


@pytest.mark.parametrize("text", ["gpu", "web,worker", ",", ""])
def test_a_role_that_does_not_exist_is_refused_naming_the_roles(text):
    with pytest.raises(RolesError, match="the roles are engine, ingest, prefill, decode, web"):
        parse_roles(text)


def test_each_role_is_one_process_and_a_node_runs_only_its_roles():
    every = appliance_processes(python=sys.executable, port=8123, settings=settings)
    # ... and Celery beat beside the web server, for the sources' polls (APPLIANCE_SOURCE_TICK_S).
    assert [spec.role for spec in every] == [*ROLES, "web"]
    node = appliance_processes(python=sys.executable, port=8123, settings=settings, roles=("prefill", "decode"))
    assert [spec.name for spec in node] == ["prefill-worker", "decode-worker"]
    assert [spec.argv for spec in node] == [spec.argv for spec in every if spec.role in ("prefill", "decode")]
    web, beat = appliance_processes(python=sys.executable, port=8123, settings=settings, roles=("web",))
    assert "8123" in web.argv and beat.name == "beat"


def _without_external_services(monkeypatch):
    for name in ("DATABASE_URL", "REDIS_URL", "DATABASE_URL_FILE", "REDIS_URL_FILE", "APPLIANCE_ROLES"):
        monkeypatch.delenv(name, raising=False)


def test_serve_refuses_an_unknown_role_before_starting_anything(monkeypatch):
    _without_external_services(monkeypatch)
    with pytest.raises(CommandError, match="unknown role"):
        call_command("serve", roles="web,gpu")


def test_a_node_without_the_web_role_is_told_to_point_at_the_web_nodes_services(monkeypatch):
    _without_external_services(monkeypatch)
    with pytest.raises(CommandError, match="set DATABASE_URL and REDIS_URL"):
        call_command("serve", roles="prefill,decode")
    monkeypatch.setenv("APPLIANCE_ROLES", "engine")
    with pytest.raises(CommandError, match="set DATABASE_URL and REDIS_URL"):
        call_command("serve")
    monkeypatch.setenv("DATABASE_URL", "postgres://elsewhere/db")
    with pytest.raises(CommandError, match="set REDIS_URL$"):
        call_command("serve")


def test_a_node_with_four_gpus_runs_an_engine_per_pair_each_with_its_own_workers(settings, tmp_path):
    settings.APPLIANCE_ENGINES, settings.APPLIANCE_TENSOR_PARALLEL_SIZE = 2, 2
    settings.APPLIANCE_ENGINE_GPUS = ["0", "1", "2", "3"]
    settings.APPLIANCE_ENGINE_SOCKET = tmp_path / "engine.sock"
    settings.APPLIANCE_ENGINE_LISTEN = "0.0.0.0:8470"  # noqa: S104 - a GPU node listens for other nodes
    specs = {spec.name: spec for spec in appliance_processes(python=sys.executable, port=8123, settings=settings)}
    assert list(specs) == ["engine", "engine-1", "ingest-worker", "prefill-worker", "prefill-worker-1",
                           "decode-worker", "decode-worker-1", "web", "beat"]  # fmt: skip
    assert specs["engine"].env == {"CUDA_VISIBLE_DEVICES": "0,1"}  # the first keeps the node's socket and port
    assert specs["engine-1"].env == {
        "CUDA_VISIBLE_DEVICES": "2,3",
        "APPLIANCE_ENGINE_SOCKET": str(tmp_path / "engine-1.sock"),
        "APPLIANCE_ENGINE_LISTEN": "0.0.0.0:8471",
    }
    # Each engine's workers reach their own engine, under a Celery name of their own.
    assert specs["prefill-worker"].env["APPLIANCE_ENGINE_URL"] == f"unix:{tmp_path / 'engine.sock'}"
    assert specs["decode-worker-1"].env["APPLIANCE_ENGINE_URL"] == f"unix:{tmp_path / 'engine-1.sock'}"
    assert "decode-1@%h" in specs["decode-worker-1"].argv and "decode@%h" in specs["decode-worker"].argv
    assert "ingest-worker-1" not in specs  # ingest does not use the engine: one pool per node


def test_more_engines_than_the_gpus_named_is_refused(settings):
    settings.APPLIANCE_ENGINES, settings.APPLIANCE_TENSOR_PARALLEL_SIZE = 4, 2
    settings.APPLIANCE_ENGINE_GPUS = ["0", "1", "2", "3"]
    with pytest.raises(RolesError, match="needs 8 GPUs; APPLIANCE_ENGINE_GPUS names 4"):
        appliance_processes(python=sys.executable, port=8123, settings=settings)


def test_a_node_without_the_engine_role_keeps_one_set_of_workers_for_the_engine_it_is_given(settings):
    settings.APPLIANCE_ENGINES = 2
    node = appliance_processes(python=sys.executable, port=8123, settings=settings, roles=("prefill", "decode"))
    assert [spec.name for spec in node] == ["prefill-worker", "decode-worker"]
    assert all("APPLIANCE_ENGINE_URL" not in spec.env for spec in node)  # APPLIANCE_ENGINE_URL of the node's own


def test_a_second_serve_on_the_same_var_directory_is_refused_naming_the_first(monkeypatch, tmp_path):
    """Two supervisors on one var directory would share an embedded Postgres that only one of
    them watches: the second is refused before it starts anything, and the directory is free
    again once the first has ended, however it ended."""
    _without_external_services(monkeypatch)
    monkeypatch.setattr(settings, "VAR_DIR", tmp_path)
    holder = subprocess.Popen(  # a real other process holds the lock, as a running `make run` does
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from appliance.supervisor import ServeLock; "
         "lock = ServeLock(Path(sys.argv[1])); lock.acquire(); print('held', flush=True); time.sleep(120)", str(tmp_path)],
        cwd=settings.BASE_DIR, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CommandError, match=rf"Another `manage.py serve` \(pid {holder.pid}\) is running on"):
            call_command("serve")
        with pytest.raises(AlreadyServing):
            ServeLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    lock = ServeLock(tmp_path)
    lock.acquire()  # the kernel dropped the killed holder's lock
    assert (tmp_path / "run" / "serve.lock").read_text().strip() == str(os.getpid())
    lock.release()
