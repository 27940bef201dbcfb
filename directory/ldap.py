"""The appliance's LDAP client (ldap3): find an account, check its password, read its groups, list
the accounts the directory knows for the periodic sync.

Sign-in is *search, then bind*, as an administrator configuring a directory expects: the appliance
binds as its service account (``APPLIANCE_LDAP_BIND_DN``), finds the one account matching
``APPLIANCE_LDAP_USER_FILTER`` with the user name typed in, then binds as that account's DN with
the password typed in. The filter decides who may sign in at all: a disabled account left out by
it (Active Directory's ``userAccountControl`` bit 2, OpenLDAP's ppolicy ``pwdAccountLockedTime``)
is not found, so it cannot sign in and the sync deactivates it here.

Groups are those whose entries match ``APPLIANCE_LDAP_GROUP_FILTER`` with ``{user_dn}`` replaced
by the account's DN (escaped), under ``APPLIANCE_LDAP_GROUP_SEARCH_BASE``: groupOfNames'
``member`` by default; Active Directory's nested groups with the in-chain matching rule.

django-python3-ldap finds and links accounts by user name and binds with a DN made from the name
typed in; django-auth-ldap needs python-ldap, a C extension with no wheel on PyPI (the appliance
installs from wheels only). So this is a small client of ldap3, the library the former builds on.
"""

from __future__ import annotations

import logging
import math
import ssl
import uuid
from dataclasses import dataclass

import ldap3
from ldap3.core.exceptions import LDAPBindError, LDAPException
from ldap3.utils.conv import escape_filter_chars

logger = logging.getLogger(__name__)

LdapError = LDAPException


@dataclass(frozen=True)
class LdapSettings:
    urls: tuple[str, ...]
    bind_dn: str
    bind_password: str
    start_tls: bool
    ca_file: str | None
    user_search_base: str
    user_filter: str
    username_attribute: str
    id_attribute: str
    group_search_base: str
    group_filter: str
    timeout_s: float

    @classmethod
    def from_settings(cls) -> LdapSettings:
        from django.conf import settings

        return cls(
            urls=tuple(settings.APPLIANCE_LDAP_URLS),
            bind_dn=settings.APPLIANCE_LDAP_BIND_DN,
            bind_password=settings.APPLIANCE_LDAP_BIND_PASSWORD,
            start_tls=settings.APPLIANCE_LDAP_START_TLS,
            ca_file=settings.APPLIANCE_LDAP_CA_FILE,
            user_search_base=settings.APPLIANCE_LDAP_USER_SEARCH_BASE,
            user_filter=settings.APPLIANCE_LDAP_USER_FILTER,
            username_attribute=settings.APPLIANCE_LDAP_USERNAME_ATTRIBUTE,
            id_attribute=settings.APPLIANCE_LDAP_ID_ATTRIBUTE,
            group_search_base=settings.APPLIANCE_LDAP_GROUP_SEARCH_BASE or settings.APPLIANCE_LDAP_USER_SEARCH_BASE,
            group_filter=settings.APPLIANCE_LDAP_GROUP_FILTER,
            timeout_s=settings.APPLIANCE_LDAP_TIMEOUT_S,
        )


@dataclass(frozen=True)
class LdapAccount:
    dn: str
    id: str  # entryUUID, or objectGUID written as a UUID
    username: str
    email: str
    first_name: str
    last_name: str


def stable_id(raw: bytes | str, attribute: str = "entryUUID") -> str:
    """An entry's id as text: entryUUID (and the like) is text already; Active Directory's
    objectGUID is 16 bytes (a little-endian GUID), written the way AD's own tools show it."""
    if isinstance(raw, bytes) and attribute.lower() == "objectguid" and len(raw) == 16:
        return str(uuid.UUID(bytes_le=raw))
    text = raw if isinstance(raw, str) else raw.decode("utf-8", errors="backslashreplace")
    return text.strip().lower()


def _first(attributes: dict, name: str) -> str:
    value = attributes.get(name)
    if isinstance(value, list):
        value = value[0] if value else ""
    return str(value or "")


class LdapDirectory:
    """One configured directory. Each method opens its own connection and closes it."""

    def __init__(self, config: LdapSettings) -> None:
        self.config = config

    @classmethod
    def from_settings(cls) -> LdapDirectory:
        return cls(LdapSettings.from_settings())

    def _servers(self) -> ldap3.ServerPool:
        tls = None
        if any(url.lower().startswith("ldaps://") for url in self.config.urls) or self.config.start_tls:
            tls = ldap3.Tls(
                validate=ssl.CERT_REQUIRED,
                ca_certs_file=self.config.ca_file,
                version=ssl.PROTOCOL_TLS_CLIENT,
            )
        servers = [
            ldap3.Server(url, tls=tls, get_info=ldap3.NONE, connect_timeout=math.ceil(self.config.timeout_s))
            for url in self.config.urls
        ]
        return ldap3.ServerPool(servers, ldap3.FIRST, active=1, exhaust=30)

    def _connection(self, dn: str, password: str) -> ldap3.Connection:
        """A connection bound as ``dn``; LDAPBindError if the password is wrong."""
        connection = ldap3.Connection(
            self._servers(),
            user=dn or None,
            password=password or None,
            auto_bind=ldap3.AUTO_BIND_NONE,
            raise_exceptions=True,
            receive_timeout=math.ceil(self.config.timeout_s),
            read_only=True,
        )
        try:
            connection.open()
            if self.config.start_tls and not connection.server.ssl:
                connection.start_tls()
            connection.bind()
        except BaseException:
            connection.unbind()
            raise
        return connection

    def _service(self) -> ldap3.Connection:
        return self._connection(self.config.bind_dn, self.config.bind_password)

    def _account_of(self, entry: dict) -> LdapAccount | None:
        attributes = entry.get("attributes") or {}
        raw = (entry.get("raw_attributes") or {}).get(self.config.id_attribute)
        if not raw:
            logger.warning("LDAP: %s has no %s; it cannot sign in", entry.get("dn"), self.config.id_attribute)
            return None
        return LdapAccount(
            dn=entry["dn"],
            id=stable_id(raw[0], self.config.id_attribute),
            username=_first(attributes, self.config.username_attribute),
            email=_first(attributes, "mail"),
            first_name=_first(attributes, "givenName"),
            last_name=_first(attributes, "sn"),
        )

    def _attributes(self) -> list[str]:
        return [self.config.username_attribute, self.config.id_attribute, "mail", "givenName", "sn"]

    def find(self, username: str) -> LdapAccount | None:
        """The one account the user filter lets in with this user name, or None (none, or several)."""
        if not username or len(username) > 256:
            return None
        search = f"(&{self.config.user_filter}({self.config.username_attribute}={escape_filter_chars(username)}))"
        connection = self._service()
        try:
            connection.search(
                self.config.user_search_base, search, ldap3.SUBTREE, attributes=self._attributes(), size_limit=2
            )
            entries = [e for e in connection.response if e.get("type") == "searchResEntry"]
        finally:
            connection.unbind()
        if len(entries) != 1:
            if entries:
                logger.warning("LDAP: %d accounts match the user name %r; none may sign in", len(entries), username)
            return None
        return self._account_of(entries[0])

    def password_matches(self, account: LdapAccount, password: str) -> bool:
        """Bind as the account (a bind with an empty password would be an anonymous one: refused)."""
        if not password:
            return False
        try:
            self._connection(account.dn, password).unbind()
        except LDAPBindError:
            return False
        return True

    def groups_of(self, dn: str, connection: ldap3.Connection | None = None) -> list[str]:
        """The DNs of the groups the account ``dn`` is in (by the group filter)."""
        search = self.config.group_filter.replace("{user_dn}", escape_filter_chars(dn))
        own = connection is None
        connection = connection or self._service()
        try:
            entries = connection.extend.standard.paged_search(
                self.config.group_search_base, search, ldap3.SUBTREE, attributes=[], paged_size=200, generator=False
            )
            return [e["dn"] for e in entries if e.get("type") == "searchResEntry"]
        finally:
            if own:
                connection.unbind()

    def accounts_by_id(self) -> dict[str, LdapAccount]:
        """Every account the user filter lets in under the search base, by stable id (paged)."""
        connection = self._service()
        try:
            entries = connection.extend.standard.paged_search(
                self.config.user_search_base,
                self.config.user_filter,
                ldap3.SUBTREE,
                attributes=self._attributes(),
                paged_size=500,
                generator=True,
            )
            found = {}
            for entry in entries:
                if entry.get("type") != "searchResEntry":
                    continue
                account = self._account_of(entry)
                if account is not None:
                    found[account.id] = account
            return found
        finally:
            connection.unbind()

    def service_connection(self) -> ldap3.Connection:
        """A connection bound as the service account, for several searches in a row (the sync)."""
        return self._service()
