"""OpenID Connect sign-in through the appliance's views (Django's test client) against the real
provider (tests/directory/oidc_provider/, PKCE required): the account linked by ``iss`` + ``sub``,
groups and staff from the ``groups`` claim, the sign-in page with and without the local form,
local sign-in while the provider is down, and an inactive account's session and tokens refused."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.contrib.auth.models import User
from django.test import Client

from api import services as token_services
from api.models import Scope
from directory.mapping import group_key
from directory.models import DirectoryIdentity, Provider
from tests.directory import oidc

pytestmark = pytest.mark.django_db

CALLBACK = "http://testserver/oidc/callback/"


@pytest.fixture(scope="module")
def provider():
    server = oidc.start_provider(CALLBACK)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def oidc_settings(settings, provider):
    settings.APPLIANCE_OIDC_DISCOVERY_URL = provider.issuer  # the issuer: the discovery path is added
    settings.APPLIANCE_OIDC_NAME = "Example Org"
    settings.OIDC_RP_CLIENT_ID = oidc.CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = oidc.CLIENT_SECRET
    settings.APPLIANCE_OIDC_GROUP_MAP = {group_key("legal-team"): ("Legal",), group_key("finance-team"): ("Finance",)}
    settings.APPLIANCE_OIDC_STAFF_GROUPS = frozenset({group_key("appliance-admins")})
    settings.AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend", "directory.oidc.OidcBackend"]
    from directory import oidc as appliance_oidc

    appliance_oidc._discovered.clear()
    return settings


def oidc_sign_in(client: Client, provider, username: str) -> str:
    """Through the provider's own sign-in form, as a browser would; returns where the appliance's
    callback sends the browser."""
    to_provider = client.get("/oidc/authenticate/")
    assert to_provider.status_code == 302
    authorize = to_provider["Location"]
    query = parse_qs(urlsplit(authorize).query)
    assert query["code_challenge_method"] == ["S256"] and len(query["code_challenge"][0]) >= 43  # PKCE
    browser = requests.Session()
    form = browser.get(authorize, timeout=10)
    assert "/accounts/login/" in form.url
    signed_in = browser.post(
        form.url,
        data={
            "csrfmiddlewaretoken": browser.cookies["provider_csrftoken"],
            "username": username,
            "password": oidc.USERS[username][0],
            "next": parse_qs(urlsplit(form.url).query)["next"][0],
        },
        headers={"Referer": form.url},
        allow_redirects=False,
        timeout=10,
    )
    assert signed_in.status_code == 302, signed_in.text[:500]
    answer = browser.get(
        f"http://127.0.0.1:{provider.port}{signed_in.headers['Location']}", allow_redirects=False, timeout=10
    )
    callback = answer.headers["Location"]
    assert callback.startswith(CALLBACK), callback
    back = client.get(callback.removeprefix("http://testserver"))
    assert back.status_code == 302
    return back["Location"]


def test_an_account_is_linked_by_issuer_and_subject_with_groups_and_staff_from_the_claim(oidc_settings, provider):
    client = Client()
    assert oidc_sign_in(client, provider, "frank") == "/documents/"
    frank = User.objects.get(username="frank")
    identity = DirectoryIdentity.objects.get(user=frank)
    assert (identity.provider, identity.issuer) == (Provider.OIDC, provider.issuer)
    assert identity.subject.isdigit()  # the provider's sub (its user's id), not the name
    assert set(frank.groups.values_list("name", flat=True)) == {"Finance"}
    assert frank.is_staff and not frank.is_superuser
    assert not frank.has_usable_password()
    assert client.get("/documents/").status_code == 200
    # Signing in again finds the same account.
    assert oidc_sign_in(Client(), provider, "frank") == "/documents/"
    assert User.objects.filter(username__startswith="frank").count() == 1


def test_an_api_token_of_an_oidc_account_works_and_dies_with_the_account(oidc_settings, provider):
    client = Client()
    oidc_sign_in(client, provider, "erin")
    erin = User.objects.get(username="erin")
    _, raw = token_services.token_create(user=erin, name="scripts", scopes=[Scope.READ])
    assert Client().get("/api/v1/documents", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    # An administrator deactivates the account: its token and its session stop at once.
    User.objects.filter(pk=erin.pk).update(is_active=False)
    assert Client().get("/api/v1/documents", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 401
    assert client.get("/documents/")["Location"].startswith("/accounts/login/")
    # And the provider's word does not bring it back.
    assert oidc_sign_in(Client(), provider, "erin").startswith("/accounts/login/?oidc=failed")


def test_the_sign_in_page_offers_the_organisation_beside_or_instead_of_the_form(oidc_settings):
    page = Client().get("/accounts/login/").content.decode()
    assert "Sign in with Example Org" in page and 'name="password"' in page
    oidc_settings.APPLIANCE_LOCAL_SIGNIN_FORM = False
    page = Client().get("/accounts/login/").content.decode()
    assert "Sign in with Example Org" in page and 'name="password"' not in page
    # The break-glass administrator's form is still there, at ?local=1.
    User.objects.create_superuser("admin", password="break glass password here")
    assert 'name="password"' in Client().get("/accounts/login/?local=1").content.decode()
    client = Client()
    assert (
        client.post("/accounts/login/", {"username": "admin", "password": "break glass password here"}).status_code
        == 302
    )


def test_without_oidc_the_page_is_the_local_form_alone(settings):
    settings.APPLIANCE_OIDC_DISCOVERY_URL = None
    page = Client().get("/accounts/login/").content.decode()
    assert "Sign in with" not in page and 'name="password"' in page
    assert Client().get("/oidc/authenticate/").status_code == 404


def test_a_provider_that_does_not_answer_leaves_local_sign_in_working(oidc_settings):
    oidc_settings.APPLIANCE_OIDC_DISCOVERY_URL = f"http://127.0.0.1:{oidc.free_port()}/o"
    from directory import oidc as appliance_oidc

    appliance_oidc._discovered.clear()
    User.objects.create_user("local-lee", password="a long local password")
    client = Client()
    assert (
        client.post("/accounts/login/", {"username": "local-lee", "password": "a long local password"}).status_code
        == 302
    )
    went = Client().get("/oidc/authenticate/")
    assert went.status_code == 302 and went["Location"] == "/accounts/login/?oidc=unavailable"
    page = Client().get(went["Location"]).content.decode()
    assert re.search(r"sign-in service does not answer", page)
