"""The engine host's socket takes only the appliance's own processes: an owner-only socket, a
token on every request, and the benchmark operations only on a host a benchmark started."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from appliance.supervisor import appliance_processes
from inference.engine.host import EngineConfig, EngineHost
from inference.engine.protocol import ErrorCode, decode, encode

BASE_DIR = Path(__file__).resolve().parent.parent.parent


class FakeStreams:
    """A fake connection for ``EngineHost.handle``: one request line in, answers collected."""

    def __init__(self, message: dict) -> None:
        self.line = encode(message)
        self.written = b""
        self.closed = False

    async def readline(self) -> bytes:
        line, self.line = self.line, b""
        return line

    def write(self, data: bytes) -> None:
        self.written += data

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _answer(host: EngineHost, message: dict) -> dict:
    streams = FakeStreams(message)
    asyncio.run(host.handle(streams, streams))
    return decode(streams.written.splitlines()[0])


def _host(**config) -> EngineHost:
    return EngineHost(EngineConfig(model=Path("/nonexistent"), socket_path=Path("/nonexistent.sock"), licence="x",
                                   **config))  # fmt: skip


def test_a_request_without_the_token_is_refused_before_anything_else():
    host = _host(token="the-token", benchmark_ops=True)
    for message in ({"op": "stats"}, {"op": "stats", "auth": "wrong"}, {"op": "set_scheduling", "auth": ""}):
        answer = _answer(host, message)
        assert answer["type"] == "error" and answer["code"] == ErrorCode.UNAUTHORIZED
    assert _answer(host, {"op": "stats", "auth": "the-token"})["type"] == "stats"


@pytest.mark.parametrize("op", ["set_scheduling", "reset_prefix_cache", "run_direct"])
def test_benchmark_operations_are_refused_unless_a_benchmark_started_the_host(op):
    answer = _answer(_host(token="t"), {"op": op, "auth": "t", "requests": [], "settings": {}})
    assert answer["type"] == "error" and answer["code"] == ErrorCode.FORBIDDEN
    assert op in answer["detail"]
    allowed = _answer(_host(token="t", benchmark_ops=True), {"op": op, "auth": "t", "requests": [], "settings": {}})
    assert allowed.get("code") == ErrorCode.ENGINE_RESTARTING  # let through: this host has no engine yet


def test_the_appliance_starts_its_engine_host_without_benchmark_operations(tmp_path, settings):
    # make run's engine host: the production settings, nothing in the environment about it
    env = {k: v for k, v in os.environ.items() if not k.startswith(("APPLIANCE_", "DJANGO_"))}
    env.update(DJANGO_SETTINGS_MODULE="appliance.settings", APPLIANCE_VAR_DIR=str(tmp_path))
    code = (
        "import django; django.setup(); from inference.engine.host import EngineConfig; "
        "c = EngineConfig.from_settings(); print(c.benchmark_ops, len(c.token))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=BASE_DIR, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()  # fmt: skip
    assert out == ["False", "43"]  # no benchmark operations; a generated token (32 random bytes)
    assert stat.S_IMODE((tmp_path / "secrets" / "engine_token").stat().st_mode) == 0o600
    (spec,) = [s for s in appliance_processes(python=sys.executable, port=1, settings=settings) if s.name == "engine"]
    assert "APPLIANCE_ENGINE_BENCHMARK_OPS" not in spec.env


def test_the_live_engine_socket_is_owner_only_and_refuses_a_stranger(engine_host):
    path = Path(engine_host.socket_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))  # root (the test) may connect; the token is what it lacks
        sock.sendall(json.dumps({"op": "stats"}).encode() + b"\n")
        answer = json.loads(sock.makefile("rb").readline())
    assert answer == {"type": "error", "code": ErrorCode.UNAUTHORIZED, "detail": "not authenticated"}
    assert engine_host.stats()["model"]  # the appliance's own client, with the token, is served
