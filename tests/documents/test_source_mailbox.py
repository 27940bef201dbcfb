"""IMAP mailboxes as sources, against a real IMAP server started by the test (Debian's dovecot,
``tests/documents/dovecot.py``) and through the real ingest worker: messages become e-mail
documents of the source's owner and groups with their attachments as documents of their own,
each message once (a second poll, a rebuilt mailbox), and the mailbox is left as it was (no
message marked read). TLS from the start and STARTTLS, the password from a file; a wrong
password, an unknown CA, a closed port, a silent server or a missing folder each leave a message
a person understands on the source, and nothing else breaks."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client
from django.urls import reverse

from appliance.embedded import free_port
from documents.models import Document, Source, SourceItem
from documents.source_services import source_forget_failed, source_poll
from tests.conftest import all_read, read, wait_until
from tests.documents import dovecot as imap_server
from tests.pdfs import make_eml, make_pdf

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def dovecot():
    server = imap_server.start_dovecot()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def legal(alice) -> Group:
    group = Group.objects.create(name="Legal")
    alice.groups.add(group)
    return group


@pytest.fixture
def password_file(tmp_path) -> Path:
    path = tmp_path / "imap-password"
    path.write_text(imap_server.PASSWORD + "\n")
    path.chmod(0o600)
    return path


def mailbox_source(dovecot, owner, password_file: Path, **fields) -> Source:
    values = {
        "name": "Records mailbox",
        "kind": Source.Kind.IMAP,
        "owner": owner,
        "imap_host": "127.0.0.1",
        "imap_port": dovecot.imaps_port,
        "imap_tls": Source.Tls.IMPLICIT,
        "imap_ca_file": dovecot.ca_file,
        "imap_username": imap_server.USERNAME,
        "imap_password_file": str(password_file),
        **fields,
    }
    source = Source(**values)
    source.full_clean()
    source.save()
    return source


def letter(subject: str, body: str, attachments=None) -> bytes:
    return make_eml(subject=subject, plain=body, attachments=attachments).replace(
        b"<test-1@example.com>", f"<{abs(hash(subject))}@example.com>".encode()
    )


def emails(source: Source):
    return Document.objects.filter(source=source, parent__isnull=True)


def test_a_mailbox_s_messages_arrive_once_as_e_mails_with_their_attachments(
    dovecot, alice, legal, password_file, browser, workers
):
    pdf = make_pdf(["Lease of the third floor.\nThe rent is 4,200 EUR a month, due on the first day."])
    first = dovecot.append(
        letter("Lease renewal for the third floor", "Please find the signed lease attached. Can you confirm the "
               "rent from May?", attachments=[("lease.pdf", pdf, "application/pdf")])
    )  # fmt: skip
    source = mailbox_source(dovecot, alice, password_file)
    source.groups.set([legal])

    source = source_poll(source_id=source.pk)
    assert source.last_error == "" and source.last_result == "1 new", (source.last_error, source.last_result)
    email = emails(source).get()
    assert email.kind == Document.Kind.EMAIL and email.owner == alice and list(email.shared_with.all()) == [legal]
    assert email.source_path == f"INBOX, UID {first}"
    read(email)
    assert email.state == Document.State.READY and email.title == "Lease renewal for the third floor"
    attachment = wait_until(lambda: email.children.first(), timeout_s=60, message="the attachment's document")
    read(attachment)
    assert attachment.filename == "lease.pdf" and attachment.state == Document.State.READY
    assert attachment.owner == alice and list(attachment.shared_with.all()) == [legal]
    # Ready to draft a reply to: its page offers it; the form holds the e-mail as the message to
    # answer, grounded on its attachment.
    page = browser.get(f"/documents/{email.pk}/").content.decode()
    assert "Draft a reply to this e-mail" in page and "Records mailbox" in page
    form = browser.get(reverse("inference:draft_new"), {"reply_to": email.pk}).content.decode()
    assert "Can you confirm the rent from May?" in form and "Subject: Lease renewal for the third floor" in form
    assert f'<option value="{attachment.pk}" selected>' in form
    outsider = Client()
    outsider.force_login(User.objects.create_user(username="mallory", password="not in Legal at all"))
    form = outsider.get(reverse("inference:draft_new"), {"reply_to": email.pk}).content.decode()
    assert "Can you confirm the rent" not in form  # an e-mail one may not read is not answered
    # The mailbox is only read: the message is not marked read.
    assert "\\Seen" not in dovecot.flags()[first]
    assert Source.objects.get(pk=source.pk).imap_last_uid == first

    # Polled again: nothing new, nothing twice.
    source = source_poll(source_id=source.pk)
    assert source.last_result == "nothing new" and emails(source).count() == 1
    second = dovecot.append(letter("Invoice 2026-114", "The invoice for March is overdue by 30 days."))
    source = source_poll(source_id=source.pk)
    assert source.last_result == "1 new" and emails(source).count() == 2
    assert emails(source).filter(source_path=f"INBOX, UID {second}").exists()

    # A message deleted on the server (or moved out of the folder): its document stays, marked.
    dovecot.delete(first)
    source = source_poll(source_id=source.pk)
    assert source.last_result == "1 removed" and emails(source).count() == 2
    email.refresh_from_db()
    assert email.source_removed_at is not None and email.state == Document.State.READY
    assert emails(source).get(source_path=f"INBOX, UID {second}").source_removed_at is None

    # The mailbox rebuilt on the server (a new UIDVALIDITY): read again from the first message,
    # and the content hash keeps every message one document.
    uidvalidity = source.imap_uidvalidity
    Source.objects.filter(pk=source.pk).update(imap_uidvalidity=uidvalidity - 1, imap_last_uid=99)
    source = source_poll(source_id=source.pk)
    assert source.last_error == "" and source.last_result == "1 already in the library"  # read again...
    assert source.imap_uidvalidity == uidvalidity and source.imap_last_uid == second
    assert emails(source).count() == 2  # ...and not a second document
    assert Document.objects.filter(owner=alice, kind=Document.Kind.EMAIL).count() == 2
    assert list(SourceItem.objects.filter(source=source).values_list("key", flat=True)) == [f"{uidvalidity}:{second}"]
    assert "\\Seen" not in dovecot.flags()[second]
    all_read()


def test_starttls_and_another_folder(queued, dovecot, alice, password_file):
    dovecot.append(letter("Board minutes", "The board approved the budget."), mailbox="Archive/2026")
    source = mailbox_source(dovecot, alice, password_file, imap_port=dovecot.imap_port, imap_tls=Source.Tls.STARTTLS,
                            imap_mailbox="Archive/2026")  # fmt: skip
    source = source_poll(source_id=source.pk)
    assert source.last_error == "" and source.last_result == "1 new"
    assert emails(source).get().source_path.startswith("Archive/2026, UID ")
    dovecot.create("Empty")
    empty = mailbox_source(dovecot, alice, password_file, name="Empty folder", imap_mailbox="Empty")
    empty = source_poll(source_id=empty.pk)
    assert empty.last_error == "" and empty.last_result == "nothing new"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"password": "not the password"}, "refused the user name 'records@example.org' and the password in"),
        ({"password_file": "/nonexistent/imap-password"}, "cannot be read by the ingest workers: No such file"),
        ({"imap_ca_file": ""}, "TLS certificate could not be verified"),
        ({"imap_mailbox": "No such folder"}, "The folder 'No such folder' could not be opened"),
        ({"imap_tls": Source.Tls.IMPLICIT, "plain_port": True}, "TLS with the mail server"),
        ({"closed_port": True}, "refused the connection: check the host and port"),
    ],
    ids=["wrong-password", "no-password-file", "unknown-ca", "no-folder", "tls-on-plain-port", "closed-port"],
)
def test_a_mailbox_that_cannot_be_read_says_why_and_nothing_else_breaks(
    queued, dovecot, alice, password_file, tmp_path, change, message
):
    dovecot.append(letter("A message that waits", "It is taken once the source is fixed."))
    fields = {k: v for k, v in change.items() if k.startswith("imap_")}
    if "password" in change:
        password_file.write_text(change["password"])
    if "password_file" in change:
        fields["imap_password_file"] = change["password_file"]
    if change.get("plain_port"):
        fields["imap_port"] = dovecot.imap_port
    if change.get("closed_port"):
        fields["imap_port"] = free_port()
    broken = mailbox_source(dovecot, alice, password_file, **fields)
    broken = source_poll(source_id=broken.pk)
    assert message in broken.last_error, broken.last_error
    assert broken.last_success_at is None and broken.poll_started_at is None and not emails(broken).exists()
    assert broken.imap_last_uid == 0
    # Another source of the same mailbox, configured right, is polled as ever.
    good_password = tmp_path / "good-password"
    good_password.write_text(imap_server.PASSWORD)
    good = mailbox_source(dovecot, alice, good_password, name="Records, right")
    good = source_poll(source_id=good.pk)
    assert good.last_error == "" and emails(good).exists()


def test_a_server_that_does_not_answer_times_out_with_a_message(alice, password_file, settings):
    settings.APPLIANCE_SOURCE_IMAP_TIMEOUT_S = 1
    with socket.socket() as silent:  # accepts connections (the backlog) and never says a word
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        source = Source.objects.create(name="Silent", kind=Source.Kind.IMAP, owner=alice, imap_host="127.0.0.1",
                                       imap_port=silent.getsockname()[1], imap_username="x",
                                       imap_password_file=str(password_file))  # fmt: skip
        source = source_poll(source_id=source.pk)
    assert "did not answer within 1 s" in source.last_error, source.last_error


def test_a_message_over_the_size_limit_fails_alone_and_is_tried_again_when_asked(
    queued, dovecot, alice, password_file, settings
):
    settings.APPLIANCE_MAX_UPLOAD_MB = 1
    big = dovecot.append(
        letter("Scans of the deeds", "The scans.", attachments=[("deeds.txt", b"deed " * 250_000, "text/plain")]),
        mailbox="Big",
    )
    source = mailbox_source(dovecot, alice, password_file, imap_mailbox="Big")
    source = source_poll(source_id=source.pk)
    assert source.last_error == "" and source.last_result == "1 failed"
    item = SourceItem.objects.get(source=source, state=SourceItem.State.FAILED)
    assert item.key.endswith(f":{big}") and "documents may be at most 1 MB" in item.error
    small = dovecot.append(letter("A short note", "See you on Monday."), mailbox="Big")
    source = source_poll(source_id=source.pk)
    assert source.last_result == "1 new" and source.imap_last_uid == small  # the big one is not waited for
    settings.APPLIANCE_MAX_UPLOAD_MB = 2
    assert source_forget_failed(source=source) == 1
    source = source_poll(source_id=source.pk)
    assert source.last_result == "1 new, 1 already in the library", source.last_result
    assert emails(source).count() == 2 and not SourceItem.objects.filter(state=SourceItem.State.FAILED).exists()


def test_a_message_listed_with_no_size_is_read_at_most_one_byte_past_the_limit(
    queued, dovecot, alice, password_file, settings, monkeypatch
):
    """A server's listed sizes are not trusted: each message is fetched in part, at most one byte
    past the limit, so one larger than listed (or listed with no size) fails alone instead of
    being read whole into memory, and at every poll again."""
    from documents.mailbox import Mailbox

    settings.APPLIANCE_MAX_UPLOAD_MB = 1
    big = dovecot.append(
        letter("More scans", "The scans.", attachments=[("scans.txt", b"scan " * 250_000, "text/plain")]),
        mailbox="Unsized",
    )
    small = dovecot.append(letter("A short note", "See you on Tuesday."), mailbox="Unsized")
    fetched: list[int] = []
    real_fetch = Mailbox.fetch

    def fetch(self, uid, *, at_most):
        data = real_fetch(self, uid, at_most=at_most)
        fetched.append(len(data or b""))
        return data

    monkeypatch.setattr(Mailbox, "sizes", lambda self, uids: {})  # a fake answer: the server lists no sizes
    monkeypatch.setattr(Mailbox, "fetch", fetch)
    source = mailbox_source(dovecot, alice, password_file, imap_mailbox="Unsized")
    source = source_poll(source_id=source.pk)
    assert source.last_error == "" and source.last_result == "1 new, 1 failed", (source.last_error, source.last_result)
    item = SourceItem.objects.get(source=source, state=SourceItem.State.FAILED)
    assert item.key.endswith(f":{big}") and "more than the mail server listed" in item.error
    assert max(fetched) == 1024 * 1024 + 1  # the big one: never more than one byte past the limit
    assert emails(source).get().source_path == f"Unsized, UID {small}" and source.imap_last_uid == small


class HostileImapServer(threading.Thread):
    """A fake IMAP server over TLS, for one connection: it answers as a mailbox of one message
    would, until the message is fetched; then it announces ``announced`` bytes of it, sends a
    few and waits. Records whether the client hung up."""

    def __init__(self, certificates, announced: int) -> None:
        super().__init__(daemon=True)
        self.announced = announced
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(certificates.cert, certificates.key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.client_hung_up = threading.Event()

    def run(self) -> None:
        connection, _ = self.listener.accept()
        with self.context.wrap_socket(connection, server_side=True) as tls, tls.makefile("rwb") as stream:
            stream.write(b"* OK [CAPABILITY IMAP4rev1] ready\r\n")
            stream.flush()
            for line in stream:
                tag, command = line.split(b" ", 1)
                if b"BODY.PEEK" in command:
                    stream.write(b"* 1 FETCH (UID 1 BODY[]<0> {%d}\r\nFrom: a\r\n" % self.announced)
                elif b"RFC822.SIZE" in command:
                    stream.write(b"* 1 FETCH (UID 1 RFC822.SIZE 100)\r\n" + tag + b" OK done\r\n")
                elif command.startswith(b"UID FETCH"):
                    stream.write(b"* 1 FETCH (UID 1)\r\n" + tag + b" OK done\r\n")
                elif command.startswith(b"EXAMINE"):
                    stream.write(b"* 1 EXISTS\r\n* OK [UIDVALIDITY 7] ok\r\n" + tag + b" OK [READ-ONLY] done\r\n")
                else:  # LOGIN, LOGOUT
                    stream.write(tag + b" OK done\r\n")
                stream.flush()
            self.client_hung_up.set()  # the stream ended: the client closed the connection


def test_a_server_that_announces_more_than_was_asked_for_is_cut_off_unread(alice, password_file, tmp_path):
    """imaplib reads a literal in one read of the size the server announces: a server that
    announces a terabyte for a message fetched "at most N bytes" would have the worker allocate
    it. The connection is closed instead, and the source says why."""
    from tests.tls import make_certificates

    certificates = make_certificates(tmp_path / "tls", name="hostile")
    server = HostileImapServer(certificates, announced=10**12)
    server.start()
    source = Source.objects.create(name="Hostile", kind=Source.Kind.IMAP, owner=alice, imap_host="127.0.0.1",
                                   imap_port=server.port, imap_tls=Source.Tls.IMPLICIT,
                                   imap_ca_file=str(certificates.ca), imap_username="x",
                                   imap_password_file=str(password_file))  # fmt: skip
    source = source_poll(source_id=source.pk)
    assert "announced 1,000,000,000,000 bytes while reading a message of it" in source.last_error, source.last_error
    assert server.client_hung_up.wait(10)  # at once, not after a terabyte
    assert source.imap_last_uid == 0 and not emails(source).exists()
