"""A real IMAP server for the tests: Debian's ``dovecot`` (package ``dovecot-imapd``) with a
configuration of its own in a temporary folder, on free ports (IMAPS, and IMAP with STARTTLS),
a certificate from ``tests/tls.py``, one account in a passwd-file and its maildir under the
folder. It runs as an unprivileged user (``nobody`` when the tests run as root, else the tests'
own user), as every dovecot process does: it needs no system configuration and leaves none.

Messages are put in with ``Dovecot.append`` (IMAP APPEND as the account), as a mail server's
delivery would leave them: unread.
"""

from __future__ import annotations

import grp
import imaplib
import os
import pwd
import shutil
import ssl
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from appliance.embedded import free_port
from tests.tls import make_certificates

DOVECOT = "/usr/sbin/dovecot"
USERNAME = "records@example.org"
PASSWORD = "the mailbox's own password"


@dataclass
class Dovecot:
    folder: Path
    imaps_port: int
    imap_port: int
    ca_file: str
    process: subprocess.Popen

    def client(self) -> imaplib.IMAP4_SSL:
        context = ssl.create_default_context(cafile=self.ca_file)
        imap = imaplib.IMAP4_SSL("127.0.0.1", self.imaps_port, ssl_context=context, timeout=10)
        imap.login(USERNAME, PASSWORD)
        return imap

    def append(self, message: bytes, *, mailbox: str = "INBOX") -> int:
        """Put ``message`` in ``mailbox`` (created if need be); returns its UID."""
        imap = self.client()
        try:
            imap.create(mailbox)  # "already exists" for INBOX: fine
            kind, data = imap.append(mailbox, None, None, message)
            assert kind == "OK", data
            return int(data[0].split(b"APPENDUID ")[1].split(b" ")[1].rstrip(b"]"))
        finally:
            imap.logout()

    def create(self, mailbox: str) -> None:
        imap = self.client()
        try:
            imap.create(mailbox)
        finally:
            imap.logout()

    def delete(self, uid: int, *, mailbox: str = "INBOX") -> None:
        """Delete a message for good (flagged \\Deleted, then expunged), as a person would."""
        imap = self.client()
        try:
            imap.select(mailbox)
            imap.uid("STORE", str(uid), "+FLAGS.SILENT", "(\\Deleted)")
            imap.expunge()
        finally:
            imap.logout()

    def flags(self, *, mailbox: str = "INBOX") -> dict[int, str]:
        """Each message's flags, by UID (read-only, so that looking sets nothing)."""
        imap = self.client()
        try:
            imap.select(mailbox, readonly=True)
            _, data = imap.uid("FETCH", "1:*", "(UID FLAGS)")
            flags = {}
            for line in data:
                if not line:
                    continue
                text = line.decode()
                uid = int(text.split("UID ")[1].split()[0])
                flags[uid] = text.split("FLAGS (")[1].split(")")[0]
            return flags
        finally:
            imap.logout()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _config(folder: Path, *, user: str, group: str, uid: int, gid: int, imap_port: int, imaps_port: int) -> str:
    return f"""
base_dir = {folder}/run
state_dir = {folder}/state
log_path = {folder}/dovecot.log
protocols = imap
listen = 127.0.0.1
ssl = yes
ssl_cert = <{folder}/cert.pem
ssl_key = <{folder}/key.pem
ssl_min_protocol = TLSv1.2
disable_plaintext_auth = yes
auth_mechanisms = plain login
auth_failure_delay = 0
default_login_user = {user}
default_internal_user = {user}
default_internal_group = {group}
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {folder}/passwd
}}
userdb {{
  driver = static
  args = uid={uid} gid={gid} home={folder}/home/%n
}}
mail_location = maildir:~/Maildir
namespace inbox {{
  inbox = yes
  separator = /
}}
service imap-login {{
  chroot =
  inet_listener imap {{
    port = {imap_port}
  }}
  inet_listener imaps {{
    port = {imaps_port}
    ssl = yes
  }}
}}
service anvil {{
  chroot =
}}
service stats {{
  chroot =
}}
"""


def start_dovecot() -> Dovecot:
    if not Path(DOVECOT).exists():
        raise RuntimeError("Debian's dovecot is not installed; make test installs it (scripts/system-packages)")
    folder = Path(tempfile.mkdtemp(prefix="appliance-dovecot-"))
    for name in ("run", "state", "home"):
        (folder / name).mkdir()
    certificates = make_certificates(folder / "tls", name="imap")
    shutil.copy(certificates.cert, folder / "cert.pem")
    shutil.copy(certificates.key, folder / "key.pem")
    (folder / "passwd").write_text(f"{USERNAME}:{{PLAIN}}{PASSWORD}\n")
    if os.geteuid() == 0:  # never a mail server running as root in the tests
        user, group = "nobody", "nogroup"
        folder.chmod(0o755)
        for path in [folder, *folder.rglob("*")]:
            shutil.chown(path, user, group)
    else:
        user, group = pwd.getpwuid(os.geteuid()).pw_name, grp.getgrgid(os.getegid()).gr_name
    uid, gid = pwd.getpwnam(user).pw_uid, grp.getgrnam(group).gr_gid
    imap_port, imaps_port = free_port(), free_port()
    (folder / "dovecot.conf").write_text(
        _config(folder, user=user, group=group, uid=uid, gid=gid, imap_port=imap_port, imaps_port=imaps_port)
    )
    drop = {"user": uid, "group": gid, "extra_groups": []} if os.geteuid() == 0 else {}
    process = subprocess.Popen(
        [DOVECOT, "-F", "-c", str(folder / "dovecot.conf")],
        **drop,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    server = Dovecot(folder, imaps_port, imap_port, str(certificates.ca), process)
    deadline = time.monotonic() + 20
    while True:
        try:
            server.client().logout()
            return server
        except (OSError, imaplib.IMAP4.error):
            if process.poll() is not None or time.monotonic() > deadline:
                log = (folder / "dovecot.log").read_text(errors="replace") if (folder / "dovecot.log").exists() else ""
                output = (
                    process.stdout.read().decode(errors="replace")
                    if process.poll() is not None and process.stdout
                    else ""
                )
                server.stop()
                raise RuntimeError(
                    f"dovecot did not start (exit {process.returncode}): {output[-2000:]} {log[-2000:]}"
                ) from None
            time.sleep(0.1)
