"""inference/engine/client.py against a fake engine host (a Unix socket served by a thread here,
named as a fake): what a worker is told when the host is not there, when it dies with the
request in it, when its engine core restarts, and when the worker itself closes the request."""

from __future__ import annotations

import socket
import threading

import pytest

from inference.engine.client import EngineClient, EngineRestarting, EngineUnavailable
from inference.engine.protocol import GenerateRequest, decode, encode

REQUEST = GenerateRequest(request_id="r-1", messages=[{"role": "user", "content": "hi"}], max_tokens=5)


class FakeEngineHost:
    """A fake of the engine host: reads one request line, then plays ``lines`` (dicts to send, or
    ``"die"`` to drop the connection, or ``"hang"`` to wait until the client goes away)."""

    def __init__(self, path, lines) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        self.lines = lines
        self.received: list[dict] = []
        self.client_left = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            reader = conn.makefile("rb")
            self.received.append(decode(reader.readline()))
            for line in self.lines:
                if line == "die":
                    conn.shutdown(socket.SHUT_RDWR)
                    return
                if line == "hang":
                    if not conn.recv(1):  # the client closed its end
                        self.client_left.set()
                    return
                conn.sendall(encode(line))

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def host(tmp_path):
    hosts = []

    def start(lines):
        hosts.append(FakeEngineHost(tmp_path / "engine.sock", lines))
        return EngineClient(tmp_path / "engine.sock", connect_timeout_s=2)

    start.hosts = hosts

    yield start
    for each in hosts:
        each.close()


def test_no_host_is_plain_unavailable_not_an_engine_death(tmp_path):
    client = EngineClient(tmp_path / "nobody.sock", connect_timeout_s=1)
    with pytest.raises(EngineUnavailable) as raised:
        list(client.generate(REQUEST))
    assert not isinstance(raised.value, EngineRestarting)


def test_a_host_that_dies_with_the_request_in_it_is_an_in_flight_engine_death(host):
    client = host([{"type": "admitted"}, {"type": "delta", "text": "Hel", "tokens": 1}, "die"])
    events = []
    with pytest.raises(EngineRestarting) as raised:
        for event in client.generate(REQUEST):
            events.append(event.type)
    assert raised.value.in_flight is True
    assert events == ["admitted", "delta"]


def test_the_hosts_engine_restarting_answer_says_whether_the_request_was_in_it(host):
    client = host([{"type": "error", "code": "engine_restarting", "in_flight": False, "detail": "restarting"}])
    with pytest.raises(EngineRestarting) as raised:
        list(client.generate(REQUEST))
    assert raised.value.in_flight is False


def test_the_request_carries_its_user_and_whether_it_is_a_suspect(host):
    request = GenerateRequest(
        request_id="r-2", messages=[{"role": "user", "content": "hi"}], max_tokens=5, user="42", suspect=True
    )
    client = host([{"type": "done"}])
    assert [event.type for event in client.generate(request)] == ["done"]
    host.hosts[0].thread.join(5)
    sent = host.hosts[0].received[0]
    assert (sent["user"], sent["suspect"]) == ("42", True)
    assert sent["auth"] == client.token and len(client.token) >= 32  # the host's token, from var/secrets


def test_closing_the_request_from_another_thread_ends_the_stream_quietly_and_the_host_sees_it(tmp_path):
    fake = FakeEngineHost(tmp_path / "engine.sock", [{"type": "admitted"}, "hang"])
    try:
        client = EngineClient(tmp_path / "engine.sock", connect_timeout_s=2)
        aborts = []
        events = client.generate(REQUEST, opened=aborts.append)
        assert next(events).type == "admitted"
        timer = threading.Timer(0.2, aborts[0])  # another thread, while this one waits to read
        timer.start()
        assert list(events) == []  # no error: the worker closed it
        assert fake.client_left.wait(10)
        assert fake.received[0]["request_id"] == "r-1"
    finally:
        fake.close()
