"""The deploy check of directory sign-in (directory/checks.py)."""

from __future__ import annotations


def test_the_deploy_check_warns_of_ldap_without_tls(settings):
    from directory.checks import ldap_passwords_are_encrypted

    settings.APPLIANCE_LDAP_START_TLS = False
    settings.APPLIANCE_LDAP_URLS = ["ldaps://dc1.example.org"]
    assert ldap_passwords_are_encrypted(None) == []
    settings.APPLIANCE_LDAP_URLS = ["ldaps://dc1.example.org", "ldap://dc2.example.org"]
    (warning,) = ldap_passwords_are_encrypted(None)
    assert warning.id == "directory.W001" and "ldap://dc2.example.org" in warning.msg
    settings.APPLIANCE_LDAP_START_TLS = True
    assert ldap_passwords_are_encrypted(None) == []
