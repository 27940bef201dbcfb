"""A real OpenLDAP server for the tests: Debian's ``slapd`` with a small directory, started from a
temporary folder on free ports (plain LDAP and LDAPS, StartTLS on the plain one, with a CA and
certificate made for it), as an unprivileged user when the tests run as root.

The directory (``dc=example,dc=org``):

- ``ou=people``: alice and bob (in Legal), carol (in appliance-admins), dave (disabled: locked by
  the ppolicy overlay's ``pwdAccountLockedTime``, which the appliance's user filter leaves out, as
  Active Directory's filter leaves out ``userAccountControl``'s disabled bit);
- ``ou=groups``: legal, finance, appliance-admins (groupOfNames);
- ``ou=services``: the appliance's service account, which may read but not write.

Changes during a test (a member removed from a group, an account deleted or locked) go through
``Slapd.modify`` / ``Slapd.delete`` as the directory's administrator.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from appliance.embedded import free_port
from tests.tls import make_certificates

SLAPD = "/usr/sbin/slapd"
SLAPADD = "/usr/sbin/slapadd"
SUFFIX = "dc=example,dc=org"
ADMIN_DN = f"cn=admin,{SUFFIX}"
ADMIN_PASSWORD = "directory admin secret"
SERVICE_DN = f"cn=appliance,ou=services,{SUFFIX}"
SERVICE_PASSWORD = "service account secret"
PASSWORDS = {
    "alice": "alice's directory password",
    "bob": "bob's directory password",
    "carol": "carol's directory password",
    "dave": "dave's directory password",
}
LEGAL_DN = f"cn=legal,ou=groups,{SUFFIX}"
FINANCE_DN = f"cn=finance,ou=groups,{SUFFIX}"
ADMINS_DN = f"cn=appliance-admins,ou=groups,{SUFFIX}"
# Accounts that may sign in: people not locked by the password policy.
USER_FILTER = "(&(objectClass=inetOrgPerson)(!(pwdAccountLockedTime=*)))"


def person_dn(uid: str) -> str:
    return f"uid={uid},ou=people,{SUFFIX}"


def _person(uid: str, given: str, surname: str, extra: str = "") -> str:
    return (
        f"dn: {person_dn(uid)}\nobjectClass: inetOrgPerson\nuid: {uid}\ncn: {given} {surname}\n"
        f"givenName: {given}\nsn: {surname}\nmail: {uid}@example.org\nuserPassword: {PASSWORDS[uid]}\n{extra}\n"
    )


def _group(dn: str, *members: str) -> str:
    cn = dn.split(",")[0].split("=")[1]
    lines = "".join(f"member: {m}\n" for m in members)
    return f"dn: {dn}\nobjectClass: groupOfNames\ncn: {cn}\n{lines}\n"


def directory_ldif() -> str:
    return (
        f"dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\no: Example\ndc: example\n\n"
        + "".join(
            f"dn: ou={ou},{SUFFIX}\nobjectClass: organizationalUnit\nou: {ou}\n\n"
            for ou in ("people", "groups", "services", "policies")
        )
        + f"dn: cn=default,ou=policies,{SUFFIX}\nobjectClass: device\nobjectClass: pwdPolicy\ncn: default\n"
        "pwdAttribute: userPassword\npwdLockout: TRUE\n\n"
        + f"dn: {SERVICE_DN}\nobjectClass: organizationalRole\nobjectClass: simpleSecurityObject\ncn: appliance\n"
        f"userPassword: {SERVICE_PASSWORD}\n\n"
        + _person("alice", "Alice", "Archer")
        + _person("bob", "Bob", "Baker")
        + _person("carol", "Carol", "Cole")
        + _person("dave", "Dave", "Dunn", "pwdAccountLockedTime: 000001010000Z\n")
        + _group(LEGAL_DN, person_dn("alice"), person_dn("bob"), ADMIN_DN)
        + _group(FINANCE_DN, person_dn("carol"), ADMIN_DN)
        + _group(ADMINS_DN, person_dn("carol"), ADMIN_DN)  # a group has a member always
    )


def _config(folder: Path) -> str:
    return f"""
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
modulepath /usr/lib/ldap
moduleload back_mdb
moduleload ppolicy
pidfile {folder}/slapd.pid
TLSCACertificateFile {folder}/directory-ca.pem
TLSCertificateFile {folder}/directory-cert.pem
TLSCertificateKeyFile {folder}/directory-key.pem

database mdb
maxsize 10485760
suffix "{SUFFIX}"
rootdn "{ADMIN_DN}"
rootpw "{ADMIN_PASSWORD}"
directory {folder}/data
overlay ppolicy
ppolicy_default "cn=default,ou=policies,{SUFFIX}"
access to attrs=userPassword by anonymous auth by * none
access to * by users read by * none
"""


@dataclass
class Slapd:
    folder: Path
    port: int
    ldaps_port: int
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"ldap://127.0.0.1:{self.port}"

    @property
    def ldaps_url(self) -> str:
        return f"ldaps://127.0.0.1:{self.ldaps_port}"

    @property
    def ca_file(self) -> str:
        return str(self.folder / "directory-ca.pem")

    def admin(self):
        import ldap3

        return ldap3.Connection(ldap3.Server(self.url), ADMIN_DN, ADMIN_PASSWORD, auto_bind=True, raise_exceptions=True)

    def modify(self, dn: str, changes: dict) -> None:
        connection = self.admin()
        try:
            connection.modify(dn, changes)
        finally:
            connection.unbind()

    def remove_member(self, group_dn: str, member_dn: str) -> None:
        import ldap3

        self.modify(group_dn, {"member": [(ldap3.MODIFY_DELETE, [member_dn])]})

    def add_member(self, group_dn: str, member_dn: str) -> None:
        import ldap3

        self.modify(group_dn, {"member": [(ldap3.MODIFY_ADD, [member_dn])]})

    def lock(self, dn: str) -> None:
        import ldap3

        self.modify(dn, {"pwdAccountLockedTime": [(ldap3.MODIFY_REPLACE, ["000001010000Z"])]})

    def delete(self, dn: str) -> None:
        connection = self.admin()
        try:
            connection.delete(dn)
        finally:
            connection.unbind()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def start_slapd() -> Slapd:
    if not Path(SLAPD).exists():
        raise RuntimeError("Debian's slapd is not installed; make test installs it (scripts/system-packages)")
    folder = Path(tempfile.mkdtemp(prefix="appliance-slapd-"))
    (folder / "data").mkdir()
    make_certificates(folder, name="directory")
    (folder / "slapd.conf").write_text(_config(folder))
    (folder / "directory.ldif").write_text(directory_ldif())
    subprocess.run(
        [SLAPADD, "-f", str(folder / "slapd.conf"), "-l", str(folder / "directory.ldif")],
        check=True,
        capture_output=True,
    )
    privileges: list[str] = []
    if os.geteuid() == 0:  # slapd drops to an unprivileged user once its ports are open
        folder.chmod(0o755)
        for path in folder.rglob("*"):
            shutil.chown(path, "nobody", "nogroup")
        shutil.chown(folder, "nobody", "nogroup")
        privileges = ["-u", "nobody", "-g", "nogroup"]
    port, ldaps_port = free_port(), free_port()
    process = subprocess.Popen(
        [
            SLAPD,
            "-d",
            "0",
            "-f",
            str(folder / "slapd.conf"),
            *privileges,
            "-h",
            f"ldap://127.0.0.1:{port}/ ldaps://127.0.0.1:{ldaps_port}/",
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    server = Slapd(folder=folder, port=port, ldaps_port=ldaps_port, process=process)
    deadline = time.monotonic() + 20
    while True:
        try:
            server.admin().unbind()
            return server
        except Exception:
            if process.poll() is not None or time.monotonic() > deadline:
                output = process.stdout.read().decode(errors="replace") if process.stdout else ""
                server.stop()
                raise RuntimeError(f"slapd did not start (exit {process.returncode}): {output[-2000:]}") from None
            time.sleep(0.1)
