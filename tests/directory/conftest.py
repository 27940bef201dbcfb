"""Fixtures of the directory sign-in tests: a real slapd per test (tests/directory/slapd.py), and
the appliance's settings pointed at it."""

from __future__ import annotations

import pytest

from directory.mapping import group_key
from tests.directory import slapd as directory


@pytest.fixture(autouse=True)
def fresh_signin_counts():
    """The sign-in throttle's counts (in the broker) start at nothing in each test."""
    from inference.streaming import sync_client

    def clear():
        client = sync_client()
        for key in client.scan_iter("appliance:signin:*"):
            client.delete(key)

    clear()
    yield
    clear()


@pytest.fixture
def slapd():
    server = directory.start_slapd()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def ldap_settings(settings, slapd):
    """LDAP sign-in on, as an administrator would set it for this directory: Legal and Finance
    mapped to appliance groups, appliance-admins staff and superusers."""
    settings.APPLIANCE_LDAP_URLS = [slapd.url]
    settings.APPLIANCE_LDAP_BIND_DN = directory.SERVICE_DN
    settings.APPLIANCE_LDAP_BIND_PASSWORD = directory.SERVICE_PASSWORD
    settings.APPLIANCE_LDAP_START_TLS = False
    settings.APPLIANCE_LDAP_CA_FILE = None
    settings.APPLIANCE_LDAP_USER_SEARCH_BASE = f"ou=people,{directory.SUFFIX}"
    settings.APPLIANCE_LDAP_USER_FILTER = directory.USER_FILTER
    settings.APPLIANCE_LDAP_USERNAME_ATTRIBUTE = "uid"
    settings.APPLIANCE_LDAP_ID_ATTRIBUTE = "entryUUID"
    settings.APPLIANCE_LDAP_GROUP_SEARCH_BASE = f"ou=groups,{directory.SUFFIX}"
    settings.APPLIANCE_LDAP_GROUP_FILTER = "(&(objectClass=groupOfNames)(member={user_dn}))"
    settings.APPLIANCE_LDAP_GROUP_MAP = {
        group_key(directory.LEGAL_DN): ("Legal",),
        group_key(directory.FINANCE_DN): ("Finance",),
    }
    settings.APPLIANCE_LDAP_STAFF_GROUPS = frozenset({group_key(directory.ADMINS_DN)})
    settings.APPLIANCE_LDAP_SUPERUSER_GROUPS = frozenset({group_key(directory.ADMINS_DN)})
    settings.AUTHENTICATION_BACKENDS = [
        "django.contrib.auth.backends.ModelBackend",
        "directory.backends.LdapBackend",
    ]
    return settings
