"""A fake engine host, for unit tests of what reads the engine's ``stats`` (health, metrics,
the supervisor's stack test): a Unix socket server speaking the line protocol of
``inference/engine/protocol.py``, one request line in, one answer line out. It answers ``stats``
with whatever the test puts in ``stats`` (or with ``error``), and nothing else."""

from __future__ import annotations

import shutil
import socketserver
import tempfile
import threading
from pathlib import Path
from typing import Any

from inference.engine.protocol import MAX_LINE_BYTES, EngineState, ErrorCode, ProtocolError, decode, encode


class FakeEngineHost:
    def __init__(self) -> None:
        # A short directory of its own: a Unix socket path holds at most 107 bytes.
        self.directory = Path(tempfile.mkdtemp(prefix="fake-engine-"))
        self.socket_path = self.directory / "engine.sock"
        self.stats: dict[str, Any] = {
            "state": EngineState.READY,
            "model": "fake-model",
            "kv_capacity_tokens": 4096,
            "max_model_len": 2048,
            "running": 0,
            "waiting": 0,
            "kv_usage": 0.0,
        }
        self.error: dict[str, Any] | None = None  # an error event to answer instead of the stats
        self.requests: list[dict[str, Any]] = []
        fake = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                try:
                    message = decode(self.rfile.readline(MAX_LINE_BYTES))
                except ProtocolError as exc:
                    self.wfile.write(encode({"type": "error", "code": ErrorCode.PROTOCOL, "detail": str(exc)}))
                    return
                fake.requests.append(message)
                if message.get("op") != "stats":
                    answer = {"type": "error", "code": ErrorCode.PROTOCOL, "detail": "the fake answers only stats"}
                elif fake.error is not None:
                    answer = {"type": "error", **fake.error}
                else:
                    answer = {"type": "stats", **fake.stats}
                self.wfile.write(encode(answer))

        self._server = socketserver.ThreadingUnixStreamServer(str(self.socket_path), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-engine-host", daemon=True)

    def start(self) -> FakeEngineHost:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        shutil.rmtree(self.directory, ignore_errors=True)
