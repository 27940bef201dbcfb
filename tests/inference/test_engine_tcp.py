"""An engine host reached from another node: URLs of engines, TLS over TCP with the token, and
refusals of what would expose the engine (clear text beyond loopback, no token)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from appliance.embedded import free_port
from inference.engine.address import AddressError, EngineAddress, check_client, check_listen
from inference.engine.client import EngineClient, EngineRequestError, EngineUnavailable
from inference.engine.host import EngineConfig, EngineHost
from inference.engine.protocol import ErrorCode, GenerateRequest, Priority
from tests.tls import make_certificates

BASE_DIR = Path(__file__).resolve().parent.parent.parent

# --- addresses (pure) -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/srv/var/run/engine.sock", EngineAddress("unix", path="/srv/var/run/engine.sock")),
        ("unix:/srv/engine.sock", EngineAddress("unix", path="/srv/engine.sock")),
        ("unix:///srv/engine.sock", EngineAddress("unix", path="/srv/engine.sock")),
        ("tls://gpu-1.example.internal:8470", EngineAddress("tls", host="gpu-1.example.internal", port=8470)),
        ("tcp://127.0.0.1:8470/", EngineAddress("tcp", host="127.0.0.1", port=8470)),
        ("tls://[fd00::5]:8470", EngineAddress("tls", host="fd00::5", port=8470)),
    ],
)
def test_engine_urls_are_read_as_written(text, expected):
    address = EngineAddress.parse(text)
    assert address == expected
    assert EngineAddress.parse(str(address)) == address


@pytest.mark.parametrize(
    "text", ["", "http://gpu-1:8470", "tls://gpu-1", "tls://gpu-1:0", "tls://gpu-1:99999", "unix:engine.sock"]
)
def test_a_wrong_engine_url_is_refused_with_what_is_expected(text):
    with pytest.raises(AddressError, match=r"unix|host:port|empty"):
        EngineAddress.parse(text)


def test_an_engine_is_not_exposed_in_clear_text_or_without_a_token():
    with pytest.raises(AddressError, match="TLS"):
        check_listen("0.0.0.0", tls=False, token="t")  # noqa: S104 - the address refused
    with pytest.raises(AddressError, match="TOKEN"):
        check_listen("127.0.0.1", tls=True, token="")
    check_listen("127.0.0.1", tls=False, token="t")  # loopback: clear text stays on the machine
    check_listen("0.0.0.0", tls=True, token="t")  # noqa: S104
    with pytest.raises(AddressError, match="tls://10.0.0.5:8470"):
        check_client(EngineAddress.parse("tcp://10.0.0.5:8470"))
    with pytest.raises(AddressError):
        EngineClient("tcp://gpu-1.example.internal:8470", token="t")


def test_the_settings_refuse_an_engine_listening_in_clear_text_beyond_loopback(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_ENGINE_")}
    env.update(APPLIANCE_VAR_DIR=str(tmp_path), APPLIANCE_ENGINE_LISTEN="0.0.0.0:8470",
               DJANGO_SETTINGS_MODULE="appliance.settings_test")  # fmt: skip
    code = "import django; django.setup()"
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=BASE_DIR, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert run.returncode != 0
    assert "without TLS would send the engine token and every document in clear text" in run.stderr
    env.update(APPLIANCE_ENGINE_TLS_CERT="/etc/appliance/engine.pem")  # a key is needed with it
    run = subprocess.run([sys.executable, "-c", code], env=env, cwd=BASE_DIR, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert run.returncode != 0 and "APPLIANCE_ENGINE_TLS_KEY" in run.stderr


# --- a real TLS listener (the engine host's, without vLLM) -------------------------------------


class _Listening:
    """An engine host with no engine behind it, its TCP listener running in a thread's loop."""

    def __init__(self, config: EngineConfig) -> None:
        self.host = EngineHost(config)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(self.host._tcp_server(), self.loop).result(10)

    def close(self) -> None:
        async def stop() -> None:
            if self.server is not None:
                self.server.close()
                await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def tls_engine(tmp_path):
    certificates = make_certificates(tmp_path / "tls", name="node")
    port = free_port()
    listening = _Listening(
        EngineConfig(model=Path("/nonexistent"), socket_path=tmp_path / "engine.sock", licence="x", token="node-token",
                     listen=f"127.0.0.1:{port}", tls_cert=str(certificates.cert), tls_key=str(certificates.key))
    )  # fmt: skip
    try:
        yield f"tls://127.0.0.1:{port}", certificates
    finally:
        listening.close()


def test_another_node_reaches_the_engine_host_over_tls_with_the_token(tls_engine, tmp_path):
    url, certificates = tls_engine
    stats = EngineClient(url, token="node-token", tls_ca=str(certificates.ca)).stats()
    assert stats["requests_in_host"] == 0 and stats["uptime_s"] >= 0  # answered by the host (no engine behind it here)
    with pytest.raises(EngineRequestError) as refused:
        EngineClient(url, token="wrong", tls_ca=str(certificates.ca)).stats()
    assert refused.value.code == ErrorCode.UNAUTHORIZED
    # A host whose certificate another CA signed is not the engine the node was told to trust.
    stranger = make_certificates(tmp_path / "stranger", name="stranger")
    with pytest.raises(EngineUnavailable, match="certificate failed the check"):
        EngineClient(url, token="node-token", tls_ca=str(stranger.ca)).stats()
    # Clear text to the TLS port gets nothing back.
    with pytest.raises(EngineUnavailable):
        EngineClient(url.replace("tls://", "tcp://"), token="node-token", connect_timeout_s=2).stats(timeout_s=3)


def test_an_engine_host_refuses_to_listen_in_clear_text_beyond_loopback(tmp_path):
    config = EngineConfig(model=Path("/nonexistent"), socket_path=tmp_path / "engine.sock", licence="x", token="t",
                          listen="0.0.0.0:1")  # fmt: skip
    with pytest.raises(AddressError, match="without TLS"):
        asyncio.run(EngineHost(config)._tcp_server())


# --- the live engine over TLS -----------------------------------------------------------------


@pytest.mark.integration
def test_a_request_streams_from_the_live_engine_over_tls(engine_hosts, engine_host):
    client = engine_hosts.tls_client()
    assert client.stats()["pid"] == engine_host.stats()["pid"]  # the same engine host, over TCP
    request = GenerateRequest(
        request_id="over-tls", priority=Priority.DECODE, max_tokens=8, ignore_eos=True,
        messages=[{"role": "user", "content": "Write one short sentence about contracts."}],
    )  # fmt: skip
    events = list(client.generate(request, idle_timeout_s=120))
    done = [e for e in events if e.type == "done"]
    assert done and done[0].data["output_tokens"] == 8
    assert any(e.type == "delta" and e.data.get("text") for e in events)
