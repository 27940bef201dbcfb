"""Where an engine host is reached: its Unix socket on the same node, or TCP from another node.

Pure: no Django, no vLLM. Written as URLs, so that one setting (``APPLIANCE_ENGINE_URL``) names
any engine:

- ``unix:/srv/appliance/var/run/engine.sock`` (or the bare path): the local engine host's socket,
  open to the appliance's own user only (mode 0600);
- ``tls://gpu-node-1.example.internal:8470``: an engine host on another node, over TLS (the host's
  certificate checked against ``APPLIANCE_ENGINE_TLS_CA``, its name against the URL's host);
- ``tcp://127.0.0.1:8470``: plain TCP, for the loopback address only.

Every request also carries the engine token (``APPLIANCE_ENGINE_TOKEN``, the same on every node):
TLS keeps it and the documents in the prompts from being read on the wire, the token keeps
anything but the appliance from using the engine.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Scheme = Literal["unix", "tcp", "tls"]


class AddressError(ValueError):
    pass


@dataclass(frozen=True)
class EngineAddress:
    scheme: Scheme
    path: str = ""  # unix
    host: str = ""  # tcp, tls
    port: int = 0

    @classmethod
    def parse(cls, value: str | Path) -> EngineAddress:
        """``unix:/path``, ``unix:///path`` or a bare path; ``tcp://host:port``; ``tls://host:port``
        (an IPv6 host in brackets)."""
        text = str(value).strip()
        if not text:
            raise AddressError("an engine address is empty")
        if text.startswith("unix:"):
            path = text[len("unix:") :]
            if path.startswith("//"):
                path = path[2:]
            if not path.startswith("/"):
                raise AddressError(f"{text!r}: a Unix socket's path must be absolute (unix:/path/engine.sock)")
            return cls("unix", path=path)
        if "://" not in text:
            return cls("unix", path=text)
        scheme, rest = text.split("://", 1)
        if scheme not in ("tcp", "tls"):
            raise AddressError(f"{text!r}: an engine is reached by unix:, tls:// or tcp://, not {scheme}://")
        host, port = parse_host_port(rest.rstrip("/"), what=text)
        return cls("tls" if scheme == "tls" else "tcp", host=host, port=port)

    def __str__(self) -> str:
        if self.scheme == "unix":
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def loopback(self) -> bool:
        return self.scheme == "unix" or is_loopback(self.host)


def parse_host_port(text: str, *, what: str | None = None) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` (``APPLIANCE_ENGINE_LISTEN``, a URL's authority)."""
    what = what or text
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
    else:
        host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise AddressError(f"{what!r}: expected host:port (a port from 1 to 65535)")
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def check_listen(host: str, *, tls: bool, token: str) -> None:
    """Refuses a TCP listener that would expose the engine: one without a token, or one beyond
    the loopback address without TLS (the token and every prompt would cross the network in
    clear text)."""
    if not token:
        raise AddressError("an engine host listening on TCP needs APPLIANCE_ENGINE_TOKEN (the same on every node)")
    if not tls and not is_loopback(host):
        raise AddressError(
            f"listening on {host} without TLS would send the engine token and every document in clear text: "
            "set APPLIANCE_ENGINE_TLS_CERT and APPLIANCE_ENGINE_TLS_KEY (or listen on 127.0.0.1)"
        )


def check_client(address: EngineAddress) -> None:
    """Refuses plain TCP to another machine, for the same reason."""
    if address.scheme == "tcp" and not address.loopback:
        raise AddressError(f"{address}: plain TCP beyond the loopback address; use tls://{address.host}:{address.port}")
