"""``manage.py directory check`` and ``sync`` against the real slapd."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from tests.directory import slapd as directory
from tests.directory.test_ldap_signin import entry_uuid, sign_in

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("directory", *args, stdout=out)
    return out.getvalue()


def test_check_shows_what_a_user_name_would_get(ldap_settings, slapd):
    text = run("check", "carol")
    assert f"bound as {directory.SERVICE_DN}" in text
    assert "3 account(s)" in text  # alice, bob, carol; dave is locked
    assert directory.person_dn("carol") in text and entry_uuid(slapd, "carol") in text
    assert "appliance groups: Finance" in text and "staff: yes, superuser: yes" in text
    with pytest.raises(CommandError, match="dave"):
        run("check", "dave")
    ldap_settings.APPLIANCE_LDAP_BIND_PASSWORD = "wrong"
    with pytest.raises(CommandError, match="refused or did not answer"):
        run("check")


def test_sync_now_says_what_changed(ldap_settings, slapd):
    assert sign_in("bob", directory.PASSWORDS["bob"]).signed_in
    slapd.remove_member(directory.LEGAL_DN, directory.person_dn("bob"))
    assert "LDAP: 1 account(s) checked; deactivated: none; groups changed: bob" in run("sync")
    slapd.lock(directory.person_dn("bob"))
    assert "deactivated: bob" in run("sync")
    assert not User.objects.get(username="bob").is_active
