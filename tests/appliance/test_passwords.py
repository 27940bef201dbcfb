"""Passwords set on the appliance are checked: the administrator's from the environment, and
those set in the admin's forms."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("weak", ["password1234", "short", "123456789012345", "adminadmin1"])
def test_a_weak_administrator_password_from_the_environment_is_refused_and_no_account_made(weak, monkeypatch):
    monkeypatch.setenv("APPLIANCE_ADMIN_PASSWORD", weak)
    with pytest.raises(CommandError, match="APPLIANCE_ADMIN_PASSWORD is refused"):
        call_command("ensure_admin", "--username", "adminadmin")
    assert not User.objects.filter(is_superuser=True).exists()


def test_a_strong_administrator_password_from_the_environment_is_taken(monkeypatch):
    monkeypatch.setenv("APPLIANCE_ADMIN_PASSWORD", "harbour lantern quietly 42")
    call_command("ensure_admin", "--username", "root")
    assert User.objects.get(username="root").check_password("harbour lantern quietly 42")


def test_the_admin_refuses_a_short_password_for_a_new_account():
    admin = User.objects.create_superuser("boss", password="a long password indeed")
    client = Client()
    client.force_login(admin)
    response = client.post(
        "/admin/auth/user/add/", {"username": "newcomer", "password1": "abc123", "password2": "abc123"}
    )
    assert response.status_code == 200  # the form again, with the reasons
    assert "too short" in response.content.decode()
    assert not User.objects.filter(username="newcomer").exists()
