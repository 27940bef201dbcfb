"""Reading an IMAP mailbox without changing it (stdlib ``imaplib`` and ``ssl``; no ORM).

A source's mailbox belongs to the organisation's mail system, and people may read it in their
own mail client too: the appliance selects it read-only (``EXAMINE``) and fetches with
``BODY.PEEK[]``, so it never marks a message read, never moves or deletes one. The password is
read from a file at each poll (never stored in the database) and only ever sent over TLS: from
the start (IMAPS) or after STARTTLS, with the server's certificate checked against the system's
CAs or the source's own CA file.

Every failure is a ``MailboxError`` whose message says what a person can check (the host, the
port, the certificate, the user name and password, the folder's name).
"""

from __future__ import annotations

import imaplib
import re
import socket
import ssl
from dataclasses import dataclass
from types import TracebackType

IMPLICIT_TLS = "implicit"
STARTTLS = "starttls"

_UID = re.compile(rb"UID (\d+)")
_FETCH_SIZE = re.compile(rb"UID (\d+) RFC822\.SIZE (\d+)|RFC822\.SIZE (\d+) UID (\d+)")


class MailboxError(Exception):
    """The mailbox could not be read; the message is for the administrator."""


class _TooMuchAnnounced(Exception):
    """The server announced a literal larger than what was asked for."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(size, limit)
        self.size, self.limit = size, limit


class _IMAP4(imaplib.IMAP4):
    """``imaplib`` reads a literal (``{N}`` and then N bytes) in one read of the N the server
    announced: a server that announced a terabyte would have the worker allocate it. Here a
    literal larger than ``literal_limit`` closes the connection unread."""

    literal_limit = 1 << 20  # no answer but a message's text holds a literal this large

    def read(self, size: int) -> bytes:
        if size > self.literal_limit:
            try:
                self.shutdown()  # the rest of the answer is never read, and nothing more is said
            except OSError:
                pass
            raise _TooMuchAnnounced(size, self.literal_limit)
        return super().read(size)


class _IMAP4_SSL(_IMAP4, imaplib.IMAP4_SSL):  # noqa: N801 (imaplib's name)
    pass


@dataclass(frozen=True)
class MailboxAccess:
    host: str
    port: int
    tls: str  # IMPLICIT_TLS or STARTTLS
    ca_file: str  # "" for the system's CAs
    username: str
    password_file: str
    mailbox: str
    timeout_s: float

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"


def read_password(path: str) -> str:
    """The password in ``path``: its first line (a trailing newline is not part of it)."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "it is not text"
        raise MailboxError(f"The password file {path} cannot be read by the ingest workers: {reason}.") from exc
    password = lines[0] if lines else ""
    if not password:
        raise MailboxError(f"The password file {path} is empty.")
    return password


def _quoted(name: str) -> str:
    """A mailbox name as an IMAP quoted string (``imaplib`` sends arguments as they are)."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


class Mailbox:
    """One connection to a mailbox, opened read-only: ``with Mailbox(access) as mailbox:``, then
    ``uidvalidity``, ``uids_from``, ``sizes`` and ``fetch``."""

    def __init__(self, access: MailboxAccess) -> None:
        self.access = access
        self.uidvalidity = 0
        self.messages: int | None = None  # how many the folder holds, as the server said on opening it
        self._imap: _IMAP4 | None = None

    def __enter__(self) -> Mailbox:
        password = read_password(self.access.password_file)
        with self._explained("connecting to"):
            self._imap = self._connect()
        with self._explained("signing in to"):
            try:
                self._imap.login(self.access.username, password)
            except imaplib.IMAP4.error as exc:
                raise MailboxError(
                    f"The mail server {self.access.where} refused the user name {self.access.username!r} and the "
                    f"password in {self.access.password_file} ({_text(exc)}). Check both."
                ) from exc
        with self._explained("opening the folder of"):
            try:
                kind, _ = self._imap.select(_quoted(self.access.mailbox), readonly=True)
            except imaplib.IMAP4.error as exc:
                kind = f"NO {_text(exc)}"
            if kind != "OK":
                raise MailboxError(
                    f"The folder {self.access.mailbox!r} could not be opened on {self.access.where}: check its name "
                    f"(INBOX, or a folder such as “Archive/2024”)."
                )
            _, values = self._imap.response("UIDVALIDITY")
            if not values or values[0] is None:
                raise MailboxError(f"The mail server {self.access.where} did not say the folder's UIDVALIDITY.")
            self.uidvalidity = int(values[0])
            _, exists = self._imap.response("EXISTS")
            self.messages = int(exists[-1]) if exists and exists[-1] is not None else None
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._imap is not None:
            try:
                self._imap.logout()
            except (OSError, imaplib.IMAP4.error):
                pass  # the session ends with the connection either way
            self._imap = None

    def _connect(self) -> _IMAP4:
        context = ssl.create_default_context(cafile=self.access.ca_file or None)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.access.tls == IMPLICIT_TLS:
            return _IMAP4_SSL(self.access.host, self.access.port, ssl_context=context, timeout=self.access.timeout_s)
        if self.access.tls != STARTTLS:
            raise MailboxError(f"Unknown TLS mode {self.access.tls!r}: a mailbox is read over TLS only.")
        imap = _IMAP4(self.access.host, self.access.port, timeout=self.access.timeout_s)
        if "STARTTLS" not in imap.capabilities:
            imap.shutdown()
            raise MailboxError(
                f"The mail server {self.access.where} does not offer STARTTLS, and the appliance sends no password "
                f"in the clear. Use its IMAPS port (993) with TLS from the start."
            )
        imap.starttls(ssl_context=context)
        return imap

    def _explained(self, doing: str) -> _Explained:
        return _Explained(self.access, doing)

    @property
    def imap(self) -> _IMAP4:
        if self._imap is None:
            raise MailboxError("The mailbox is not open.")
        return self._imap

    def uids_from(self, first_uid: int) -> list[int]:
        """The UIDs of the folder's messages from ``first_uid`` on (the server may add the
        highest UID even when it is below: ``n:*`` includes ``*``). Asked with ``UID FETCH``, one
        line per message, rather than ``UID SEARCH``, whose one line for a mailbox of ten years
        (150,000 messages and more) is longer than ``imaplib`` reads."""
        if self.messages == 0:
            return []  # some servers answer a range on an empty folder with an error
        with self._explained("listing the messages of"):
            kind, data = self.imap.uid("FETCH", f"{max(1, first_uid)}:*", "(UID)")
            if kind != "OK":
                raise MailboxError(f"The mail server {self.access.where} did not list the folder's messages.")
        uids = []
        for line in data:
            match = _UID.search(bytes(line[0] if isinstance(line, tuple) else line or b""))
            if match:
                uids.append(int(match.group(1)))
        return uids

    def sizes(self, uids: list[int]) -> dict[int, int]:
        """Each message's size in bytes, asked before fetching it (one request for all)."""
        if not uids:
            return {}
        with self._explained("reading the message sizes of"):
            kind, data = self.imap.uid("FETCH", ",".join(str(uid) for uid in uids), "(UID RFC822.SIZE)")
            if kind != "OK":
                raise MailboxError(f"The mail server {self.access.where} did not give the messages' sizes.")
        sizes: dict[int, int] = {}
        for line in data:
            text = line[0] if isinstance(line, tuple) else line
            match = _FETCH_SIZE.search(bytes(text or b""))
            if match:
                uid, size = (match.group(1), match.group(2)) if match.group(1) else (match.group(4), match.group(3))
                sizes[int(uid)] = int(size)
        return sizes

    def fetch(self, uid: int, *, at_most: int) -> bytes | None:
        """The message (RFC 822 bytes), without setting its \\Seen flag: at most ``at_most`` + 1
        bytes of it, so a message larger than its listed size (or listed with none) is seen to
        be too large, not read whole into memory; None if it was deleted on the server since it
        was listed."""
        imap = self.imap
        imap.literal_limit = max(_IMAP4.literal_limit, at_most + 1)
        try:
            with self._explained("reading a message of"):
                kind, data = imap.uid("FETCH", str(uid), f"(BODY.PEEK[]<0.{at_most + 1}>)")
        finally:
            imap.literal_limit = _IMAP4.literal_limit
        if kind != "OK":
            raise MailboxError(f"The mail server {self.access.where} did not give message UID {uid}.")
        for part in data:
            if isinstance(part, tuple) and len(part) == 2:
                return bytes(part[1])
        return None


class _Explained:
    """Turns the errors of a step into a ``MailboxError`` that says what to check."""

    def __init__(self, access: MailboxAccess, doing: str) -> None:
        self.access, self.doing = access, doing

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if exc is None or isinstance(exc, MailboxError):
            return
        where = self.access.where
        message: str | None = None
        if isinstance(exc, _TooMuchAnnounced):
            message = (
                f"The mail server {where} announced {exc.size:,} bytes while {self.doing} it, more than the "
                f"{exc.limit:,} asked for: the appliance closed the connection without reading them."
            )
        elif isinstance(exc, TimeoutError | socket.timeout):
            message = f"The mail server {where} did not answer within {self.access.timeout_s:g} s ({self.doing} it)."
        elif isinstance(exc, ssl.SSLCertVerificationError):
            message = (
                f"The mail server {where}'s TLS certificate could not be verified ({exc.verify_message}). If it has "
                f"a certificate from the organisation's own CA, set the source's CA file."
            )
        elif isinstance(exc, ssl.SSLError):
            message = f"TLS with the mail server {where} failed ({exc.reason or exc}): check the port and TLS mode."
        elif isinstance(exc, socket.gaierror):
            message = f"The mail server's name {self.access.host!r} could not be resolved."
        elif isinstance(exc, ConnectionRefusedError):
            message = f"The mail server {where} refused the connection: check the host and port."
        elif isinstance(exc, imaplib.IMAP4.abort | ConnectionError | EOFError):
            message = f"The mail server {where} closed the connection while {self.doing} it."
        elif isinstance(exc, imaplib.IMAP4.error):
            message = f"The mail server {where} answered with an error while {self.doing} it: {_text(exc)}."
        elif isinstance(exc, OSError):
            message = f"The mail server {where} could not be reached ({exc.strerror or exc})."
        if message is not None:
            raise MailboxError(message) from exc


def _text(exc: BaseException) -> str:
    """An imaplib error's server text (it is often ``b'[AUTHENTICATIONFAILED] ...'``)."""
    value = exc.args[0] if exc.args else exc
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).strip()
