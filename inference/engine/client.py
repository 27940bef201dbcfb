"""The client the inference workers and the web process use to reach the engine host.

Blocking sockets, one connection per call, so that it works the same in a Celery thread, a
management command or a Django view. The engine host is this node's (its Unix socket) or
another node's (TLS over TCP; ``address.EngineAddress``). It imports nothing from vLLM.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.engine.address import EngineAddress, check_client
from inference.engine.protocol import MAX_LINE_BYTES, ErrorCode, GenerateRequest, decode, encode


class EngineUnavailable(ConnectionError):
    """The engine host is not running or not answering."""


class EngineRestarting(EngineUnavailable):
    """The engine core died and the host is starting it again: try the request later.
    ``in_flight``: the request was in the engine when it died (it may be what killed it)."""

    def __init__(self, detail: str, *, in_flight: bool) -> None:
        super().__init__(detail)
        self.in_flight = in_flight


class _ConnectionBroke(EngineUnavailable):
    """The connection broke while an answer was being read (not a timeout)."""


class EngineRequestError(RuntimeError):
    """The engine host refused or failed a request; ``code`` says why."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True)
class StreamEvent:
    type: str  # "admitted", "delta", "done"
    data: dict[str, Any]
    received_at: float  # time.time() when the event reached this process


class EngineClient:
    """``address``: a Unix socket's path, or an ``EngineAddress`` URL (``tls://host:port``).
    ``token``: the engine host's (``APPLIANCE_ENGINE_TOKEN``, by default generated under
    ``var/secrets/``), sent on every request; None reads it from the Django settings.
    ``tls_ca``: the CA file a ``tls://`` host's certificate is checked against (None: the
    settings' ``APPLIANCE_ENGINE_TLS_CA``, else the system's trusted CAs)."""

    def __init__(
        self,
        address: Path | str | EngineAddress,
        *,
        connect_timeout_s: float = 5.0,
        token: str | None = None,
        tls_ca: str | None = None,
    ) -> None:
        self.address = address if isinstance(address, EngineAddress) else EngineAddress.parse(address)
        check_client(self.address)
        self.connect_timeout_s = connect_timeout_s
        if token is None or (tls_ca is None and self.address.scheme == "tls"):
            from django.conf import settings

            token = settings.APPLIANCE_ENGINE_TOKEN if token is None else token
            tls_ca = settings.APPLIANCE_ENGINE_TLS_CA if tls_ca is None else tls_ca
        self.token = token
        self._tls: ssl.SSLContext | None = None
        if self.address.scheme == "tls":
            self._tls = ssl.create_default_context(cafile=tls_ca or None)  # checks the certificate and the name

    @property
    def socket_path(self) -> str:
        """The Unix socket's path ("" for an engine over TCP)."""
        return self.address.path

    @classmethod
    def from_settings(cls) -> EngineClient:
        from django.conf import settings

        return cls(
            settings.APPLIANCE_ENGINE_URL or settings.APPLIANCE_ENGINE_SOCKET,
            connect_timeout_s=settings.APPLIANCE_ENGINE_CONNECT_TIMEOUT_S,
        )

    def _connect(self, read_timeout_s: float | None) -> socket.socket:
        address = self.address
        try:
            if address.scheme == "unix":
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(self.connect_timeout_s)
                try:
                    sock.connect(address.path)
                except OSError:
                    sock.close()
                    raise
            else:
                sock = socket.create_connection((address.host, address.port), timeout=self.connect_timeout_s)
                if self._tls is not None:
                    try:
                        sock = self._tls.wrap_socket(sock, server_hostname=address.host)
                    except OSError:
                        sock.close()
                        raise
        except ssl.SSLCertVerificationError as exc:
            raise EngineUnavailable(
                f"the engine host at {address} is not the one expected: its certificate failed the check "
                f"({exc.verify_message}; is APPLIANCE_ENGINE_TLS_CA the CA that signed it?)"
            ) from exc
        except OSError as exc:  # missing socket, refused, timed out, no permission, a failed handshake
            raise EngineUnavailable(f"the engine host is not answering at {address} ({exc})") from exc
        sock.settimeout(read_timeout_s)
        return sock

    def _lines(self, sock: socket.socket) -> Iterator[dict[str, Any]]:
        reader = sock.makefile("rb")
        try:
            while True:
                try:
                    line = reader.readline(MAX_LINE_BYTES)
                except TimeoutError as exc:
                    raise EngineUnavailable("the engine host stopped answering") from exc
                except OSError as exc:
                    raise _ConnectionBroke(f"the connection to the engine host broke ({exc})") from exc
                if not line:
                    return
                message = decode(line)
                if message.get("type") == "error":
                    if message.get("code") == ErrorCode.ENGINE_RESTARTING:
                        raise EngineRestarting(str(message.get("detail")), in_flight=bool(message.get("in_flight")))
                    raise EngineRequestError(str(message.get("code")), str(message.get("detail")))
                yield message
        finally:
            reader.close()

    def _send(self, sock: socket.socket, message: dict[str, Any]) -> None:
        try:
            sock.sendall(encode({**message, "auth": self.token}))
        except OSError as exc:
            raise EngineUnavailable(f"the connection to the engine host broke ({exc})") from exc

    def _call(self, message: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        with self._connect(timeout_s) as sock:
            self._send(sock, message)
            for reply in self._lines(sock):
                return reply
        raise EngineUnavailable("the engine host closed the connection without answering")

    def stats(self, *, timeout_s: float = 5.0) -> dict[str, Any]:
        return self._call({"op": "stats"}, timeout_s=timeout_s)

    def activity(self, *, timeout_s: float = 1.0) -> dict[str, Any]:
        """The host's drafting, cheaply (``EngineHost.activity``): ``device``,
        ``drafting_requests`` and ``drafting_idle_s``."""
        return self._call({"op": "activity"}, timeout_s=timeout_s)

    def count_tokens(self, prompts: list[list[dict[str, str]]], *, timeout_s: float = 60.0) -> list[int]:
        return list(self._call({"op": "count_tokens", "prompts": prompts}, timeout_s=timeout_s)["counts"])

    def abort(self, request_id: str, *, timeout_s: float = 5.0) -> None:
        self._call({"op": "abort", "request_id": request_id}, timeout_s=timeout_s)

    def set_scheduling(
        self,
        scheduling: str | None = None,
        *,
        forget_output_lengths: bool = False,
        timeout_s: float = 30.0,
        **settings: Any,
    ) -> dict[str, Any]:
        """Switch the running host's policy (``appliance``, ``engine`` or ``fifo``) and any of the
        scheduler's settings (``step_policy.PolicyConfig``: ``reservation``, ``itl_slowdown``,
        ``long_prefill_token_threshold``, ...); ``forget_output_lengths`` also empties the output
        lengths the ``predicted`` reservation learns from. Returns the policy now in force."""
        message: dict[str, Any] = {"op": "set_scheduling", "scheduling": scheduling, "settings": settings}
        if forget_output_lengths:
            message["forget_output_lengths"] = True
        return self._call(message, timeout_s=timeout_s)

    def reset_prefix_cache(self, *, timeout_s: float = 30.0) -> None:
        self._call({"op": "reset_prefix_cache"}, timeout_s=timeout_s)

    def run_direct(self, requests: list[GenerateRequest], *, timeout_s: float = 600.0) -> dict[str, Any]:
        """Benchmarks: run requests straight on the host's ``AsyncLLM``, all at once, and return
        the output tokens, each one's time to first token and the elapsed time."""
        return self._call({"op": "run_direct", "requests": [r.to_message() for r in requests]}, timeout_s=timeout_s)

    def generate(
        self,
        request: GenerateRequest,
        *,
        idle_timeout_s: float | None = None,
        opened: Callable[[Callable[[], None]], None] | None = None,
    ) -> Generator[StreamEvent, None, None]:
        """Stream the events of one request. Closing the iterator (or leaving a ``for`` loop
        early) closes the connection, and the engine host then aborts the request.

        ``opened`` is called with a function that closes the request from any thread (a job's
        watch thread when the job is cancelled, handed on or out of time); the stream then ends
        without an error. A failure to connect is ``EngineUnavailable``: the request never
        reached the host. Once it has been sent, a stream that breaks or ends before ``done``
        means the host died with the request in it: ``EngineRestarting(in_flight=True)``, as the
        host itself says when only its engine core died."""
        sock = self._connect(idle_timeout_s)
        aborted = False

        def abort() -> None:
            nonlocal aborted
            aborted = True
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked in another thread
            except OSError:
                pass

        try:
            if opened is not None:
                opened(abort)
            try:
                self._send(sock, request.to_message())
                for message in self._lines(sock):
                    event = StreamEvent(type=str(message["type"]), data=message, received_at=time.time())
                    yield event
                    if event.type == "done":
                        return
            except _ConnectionBroke as exc:
                if aborted:
                    return
                raise EngineRestarting(f"{exc} while the request ran", in_flight=True) from exc
            except EngineUnavailable:
                if aborted:
                    return
                raise
            if not aborted:
                raise EngineRestarting("the engine host closed the stream before the request finished", in_flight=True)
        finally:
            sock.close()
