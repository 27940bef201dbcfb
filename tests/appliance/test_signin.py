"""Sign-in is throttled (counted in the real broker): a name guessed at is refused for a while,
however right the next guess, and so is an address that tries many names."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from inference.streaming import sync_client

pytestmark = pytest.mark.django_db

PASSWORD = "a long password indeed"


@pytest.fixture(autouse=True)
def fresh_counts():
    def clear():
        client = sync_client()
        for key in client.scan_iter("appliance:signin:*"):
            client.delete(key)

    clear()
    yield
    clear()


def _sign_in(client: Client, username: str, password: str, address: str = "192.0.2.7"):
    return client.post("/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def test_after_five_wrong_passwords_the_name_is_refused_even_with_the_right_one(settings):
    User.objects.create_user("alice", password=PASSWORD)
    User.objects.create_user("bob", password=PASSWORD)
    client = Client()
    for _ in range(settings.APPLIANCE_LOGIN_FAILURES_PER_USER):
        assert _sign_in(client, "alice", "guess").status_code == 200  # the form again
    refused = _sign_in(client, "Alice", PASSWORD)  # the name in any case
    assert refused.status_code == 429
    assert 0 < int(refused["Retry-After"]) <= settings.APPLIANCE_LOGIN_LOCKOUT_S
    assert "Too many failed sign-ins" in refused.content.decode()
    assert "_auth_user_id" not in client.session  # not signed in
    # Another person from the same address is not held back by alice's name.
    assert _sign_in(Client(), "bob", PASSWORD).status_code == 302


def test_an_address_that_tries_many_names_is_refused(settings):
    settings.APPLIANCE_LOGIN_FAILURES_PER_ADDRESS = 3
    User.objects.create_user("carol", password=PASSWORD)
    for name in ("x1", "x2", "x3"):
        _sign_in(Client(), name, "guess", address="198.51.100.4")
    assert _sign_in(Client(), "carol", PASSWORD, address="198.51.100.4").status_code == 429
    assert _sign_in(Client(), "carol", PASSWORD, address="198.51.100.5").status_code == 302  # elsewhere


def test_a_successful_sign_in_clears_its_names_failures(settings):
    User.objects.create_user("dana", password=PASSWORD)
    for _ in range(settings.APPLIANCE_LOGIN_FAILURES_PER_USER - 1):
        _sign_in(Client(), "dana", "guess")
    assert _sign_in(Client(), "dana", PASSWORD).status_code == 302
    for _ in range(settings.APPLIANCE_LOGIN_FAILURES_PER_USER - 1):
        _sign_in(Client(), "dana", "guess")
    assert _sign_in(Client(), "dana", PASSWORD).status_code == 302  # counted afresh after the success
