"""``manage.py process NAME``: what deploy/'s units, services and containers run resolves to the
one declaration's process, and a name that is not one is refused before anything starts."""

from __future__ import annotations

import shlex
import sys
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from appliance.management.commands.process import NoSuchProcess, declared_process
from appliance.supervisor import appliance_processes


def declared(settings) -> dict:
    return {spec.name: spec for spec in appliance_processes(python=sys.executable, port=8000, settings=settings)}


@pytest.mark.parametrize(
    ("name", "process"),
    [("web", "web"), ("ingest", "ingest-worker"), ("engine", "engine"), ("engine-0", "engine"),
     ("prefill", "prefill-worker"), ("decode-0", "decode-worker"), ("DECODE", "decode-worker")],
)  # fmt: skip
def test_a_name_is_the_declared_process_of_its_role(settings, name, process):
    spec = declared_process(name, settings=settings, python=sys.executable, port=8000)
    assert spec == declared(settings)[process]


def test_each_engine_slot_has_its_engine_and_workers(settings, tmp_path):
    settings.APPLIANCE_ENGINES, settings.APPLIANCE_TENSOR_PARALLEL_SIZE = 2, 1
    settings.APPLIANCE_ENGINE_SOCKET = tmp_path / "engine.sock"
    engine = declared_process("engine-1", settings=settings, python=sys.executable, port=8000)
    prefill = declared_process("prefill-1", settings=settings, python=sys.executable, port=8000)
    assert engine.env["CUDA_VISIBLE_DEVICES"] == "1"
    assert prefill.env["APPLIANCE_ENGINE_URL"] == f"unix:{engine.env['APPLIANCE_ENGINE_SOCKET']}"
    assert "prefill-1@%h" in prefill.argv


@pytest.mark.parametrize(
    ("name", "reason"),
    [("worker", "no process"), ("web-1", "no engine slot"), ("ingest-0", "no engine slot"),
     ("engine-1", "APPLIANCE_ENGINES=1"), ("prefill-x", "no process")],
)  # fmt: skip
def test_a_name_that_is_no_declared_process_is_refused(settings, name, reason):
    with pytest.raises(NoSuchProcess, match=reason):
        declared_process(name, settings=settings, python=sys.executable, port=8000)


def test_print_shows_the_command_line_and_the_environment_it_adds(settings, tmp_path):
    settings.APPLIANCE_ENGINES = 2
    settings.APPLIANCE_ENGINE_SOCKET = tmp_path / "engine.sock"
    out = StringIO()
    call_command("process", "decode-1", "--print", stdout=out)
    words = shlex.split(out.getvalue())
    assert words[0] == f"APPLIANCE_ENGINE_URL=unix:{tmp_path / 'engine-1.sock'}"
    assert words[1:] == declared(settings)["decode-worker-1"].argv


def test_the_command_refuses_an_unknown_name():
    with pytest.raises(CommandError, match="no process 'frontend'"):
        call_command("process", "frontend", "--print")


def test_beat_without_a_schedule_has_nothing_to_run_and_says_so(settings):
    settings.CELERY_BEAT_SCHEDULE = {}
    out = StringIO()
    call_command("process", "beat", stdout=out)  # exits, successfully: its unit is not restarted
    assert "nothing to run" in out.getvalue()


def test_beat_with_a_schedule_is_the_web_roles_scheduler(settings):
    settings.CELERY_BEAT_SCHEDULE = {"ldap-sync": {"task": "directory.tasks.ldap_sync", "schedule": 900.0}}
    spec = declared_process("beat", settings=settings, python=sys.executable, port=8000)
    assert spec.role == "web" and spec.argv[4:6] == ["appliance", "beat"]


def test_a_process_on_its_own_needs_the_web_nodes_database_and_broker(monkeypatch):
    for name in ("DATABASE_URL", "DATABASE_URL_FILE", "REDIS_URL", "REDIS_URL_FILE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(CommandError, match="set DATABASE_URL and REDIS_URL"):
        call_command("process", "ingest")
