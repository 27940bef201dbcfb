"""The OpenID Connect sync against the real provider: each linked account's refresh token is
presented to the provider; removed from a group there, the account loses the group here without
signing in; deleted there, it is deactivated here and its API tokens stop."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from api import services as token_services
from api.models import Scope
from directory.models import DirectoryIdentity
from directory.oidc import unseal
from directory.tasks import oidc_sync
from tests.directory.test_ldap_signin import shared_document
from tests.directory.test_oidc_signin import oidc_settings, oidc_sign_in, provider  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db


def test_removed_from_a_group_at_the_provider_loses_it_at_the_sync(oidc_settings, provider):  # noqa: F811
    legal = shared_document("Legal memo", "Legal")
    client = Client()
    oidc_sign_in(client, provider, "erin")
    erin = User.objects.get(username="erin")
    assert client.get(f"/documents/{legal.pk}/").status_code == 200
    identity = DirectoryIdentity.objects.get(user=erin)
    sealed = identity.refresh_token_sealed
    assert sealed and unseal(sealed) and unseal(sealed) not in sealed  # kept, and not in clear

    provider.ops("remove-member", "erin", "legal-team")
    oidc_sync()  # the beat task, as the worker runs it

    assert not erin.groups.filter(name="Legal").exists()
    assert client.get(f"/documents/{legal.pk}/").status_code == 404  # the same session
    identity.refresh_from_db()
    assert identity.last_synced_at is not None and identity.directory_groups == []
    assert identity.refresh_token_sealed != sealed  # the provider rotated it; the new one is kept
    provider.ops("add-member", "erin", "legal-team")
    oidc_sync()
    assert erin.groups.filter(name="Legal").exists()


def test_deleted_at_the_provider_is_deactivated_at_the_sync(oidc_settings, provider):  # noqa: F811
    client = Client()
    oidc_sign_in(client, provider, "frank")
    frank = User.objects.get(username="frank")
    _, raw = token_services.token_create(user=frank, name="reports", scopes=[Scope.READ])
    assert Client().get("/api/v1/documents", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200

    provider.ops("delete", "frank")
    oidc_sync()

    frank.refresh_from_db()
    assert not frank.is_active
    assert Client().get("/api/v1/documents", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 401
    assert client.get("/documents/")["Location"].startswith("/accounts/login/")
    assert DirectoryIdentity.objects.get(user=frank).gone_at is not None


def test_a_provider_that_does_not_answer_changes_nothing(oidc_settings, provider):  # noqa: F811
    oidc_sign_in(Client(), provider, "erin")
    from appliance.embedded import free_port
    from directory import oidc as appliance_oidc

    oidc_settings.APPLIANCE_OIDC_DISCOVERY_URL = f"http://127.0.0.1:{free_port()}/o"
    appliance_oidc._discovered.clear()
    oidc_sync()
    erin = User.objects.get(username="erin")
    assert erin.is_active and erin.groups.filter(name="Legal").exists()


def test_a_refused_client_is_the_appliances_problem_not_the_accounts(oidc_settings, provider):  # noqa: F811
    """A wrong client secret (a rotation half done) must not read as every account refused."""
    oidc_sign_in(Client(), provider, "erin")
    oidc_settings.OIDC_RP_CLIENT_SECRET = "an old secret"
    oidc_sync()
    erin = User.objects.get(username="erin")
    assert erin.is_active and DirectoryIdentity.objects.get(user=erin).gone_at is None
