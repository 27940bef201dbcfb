"""OpenID Connect sign-in in real headless Chromium against a real provider (django-oauth-toolkit,
tests/directory/oidc_provider/, which refuses a client without PKCE): sign in with the
organisation, read a document shared with the group the provider's claim maps to, be removed from
that group at the provider, sign out and in again, and no longer read it. Screenshots go to
``var/screenshots/``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User

from directory.models import DirectoryIdentity, Provider
from documents.models import Document
from tests.directory import oidc
from tests.test_browser import SCREENSHOTS, _accessibility_violations, page  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def oidc_appliance(django_db_setup, tmp_path_factory):
    """The provider, and the appliance's web server (as `make run` starts it) configured for it."""
    from appliance.processes import start_appliance_processes
    from tests.conftest import (
        _child_env,
        _stop,
        _test_database_url,
        wait_for_web_server,
    )

    web_port = oidc.free_port()
    web_url = f"http://127.0.0.1:{web_port}"
    provider = oidc.start_provider(f"{web_url}/oidc/callback/")
    secret_file = tmp_path_factory.mktemp("oidc") / "client-secret"
    secret_file.write_text(oidc.CLIENT_SECRET + "\n")
    env = _child_env(
        DATABASE_URL=_test_database_url(),
        APPLIANCE_OIDC_DISCOVERY_URL=provider.discovery_url,
        APPLIANCE_OIDC_CLIENT_ID=oidc.CLIENT_ID,
        APPLIANCE_OIDC_CLIENT_SECRET_FILE=str(secret_file),
        APPLIANCE_OIDC_NAME="Example Org",
        APPLIANCE_OIDC_GROUP_MAP=json.dumps({"legal-team": "Legal", "finance-team": "Finance"}),
        APPLIANCE_OIDC_STAFF_GROUPS="appliance-admins",
        APPLIANCE_OIDC_SESSION_S="3600",
    )
    env.pop("APPLIANCE_OIDC_CLIENT_SECRET", None)
    (web,) = start_appliance_processes(
        {"web"},
        settings=settings,
        env=env,
        log_dir=Path(settings.VAR_DIR) / "logs",
        port=web_port,
        fresh_log=True,
        tie_to_parent=True,
    )
    try:
        wait_for_web_server(web_url)
        yield web_url, provider
    finally:
        _stop(web)
        provider.stop()


def sign_in_with_the_organisation(page, web_url: str, provider) -> None:  # noqa: F811
    """From the appliance's sign-in page through the provider and back to the library, signing in
    at the provider when its own session is not open."""
    page.goto(f"{web_url}/")
    page.get_by_role("link", name="Sign in with Example Org").click()
    at_provider = f"http://127.0.0.1:{provider.port}/accounts/login/"
    page.wait_for_url(lambda url: url.startswith(at_provider) or url == f"{web_url}/documents/")
    if page.url.startswith(at_provider):
        page.get_by_label("Example Org user name").fill("erin")
        page.get_by_label("Example Org password").fill(oidc.USERS["erin"][0])
        page.get_by_role("button", name="Continue").click()
    page.wait_for_url(f"{web_url}/documents/")


def test_sign_in_with_the_organisation_and_lose_a_group_at_the_provider(page, oidc_appliance):  # noqa: F811
    from appliance.database import close_pool

    try:
        sign_in_read_and_lose_a_group(page, *oidc_appliance)
    finally:
        # The body's database connections live in Playwright's context, which no fixture sees:
        # given back here, so that the test database can be dropped at the end of the run.
        close_pool()


def sign_in_read_and_lose_a_group(page, web_url: str, provider) -> None:  # noqa: F811
    owner = User.objects.create_user("records-office", password="a long password indeed")
    memo = Document.objects.create(
        owner=owner, title="Legal memo on the Harbour lease", filename="memo.txt", kind=Document.Kind.TEXT,
        size_bytes=1, sha256="m" * 64, state=Document.State.READY,
    )  # fmt: skip
    memo.shared_with.add(Group.objects.create(name="Legal"))

    # The sign-in page offers the organisation beside the local form.
    page.goto(f"{web_url}/accounts/login/")
    assert page.get_by_role("link", name="Sign in with Example Org").is_visible()
    assert page.get_by_label("Username").is_visible()
    assert _accessibility_violations(page) == []
    page.screenshot(path=str(SCREENSHOTS / "sign-in-with-organisation.png"), full_page=True)

    sign_in_with_the_organisation(page, web_url, provider)
    assert page.get_by_role("link", name="Legal memo on the Harbour lease").is_visible()
    page.get_by_role("link", name="Legal memo on the Harbour lease").click()
    assert page.get_by_role("heading", name="Legal memo on the Harbour lease").is_visible()
    page.screenshot(path=str(SCREENSHOTS / "oidc-signed-in-reads-group-document.png"), full_page=True)

    erin = DirectoryIdentity.objects.select_related("user").get(provider=Provider.OIDC).user
    identity = erin.directory_identity
    assert identity.issuer == provider.issuer and identity.subject.isdigit()  # the provider's iss + sub
    assert erin.username == "erin" and erin.email == "erin@example.org" and not erin.has_usable_password()
    assert set(erin.groups.values_list("name", flat=True)) == {"Legal"}
    assert not erin.is_staff
    # The session ends within APPLIANCE_OIDC_SESSION_S, when the provider is asked again.
    (session,) = [c for c in page.context.cookies() if c["name"] == "sessionid"]
    assert 3500 < session["expires"] - time.time() <= 3600

    # Removed from the group at the provider; signing out ends the appliance's session.
    provider.ops("remove-member", "erin", "legal-team")
    page.get_by_role("button", name="Sign out erin").click()
    page.wait_for_url("**/accounts/login/")
    page.goto(f"{web_url}/documents/{memo.pk}/")
    assert "/accounts/login/" in page.url  # signed out here (the provider's session may live on)

    sign_in_with_the_organisation(page, web_url, provider)
    assert page.get_by_role("link", name="Legal memo on the Harbour lease").count() == 0
    response = page.goto(f"{web_url}/documents/{memo.pk}/")
    assert response is not None and response.status == 404
    page.screenshot(path=str(SCREENSHOTS / "oidc-group-removed.png"), full_page=True)
    assert not erin.groups.filter(name="Legal").exists()
    assert DirectoryIdentity.objects.filter(provider=Provider.OIDC).count() == 1  # the same account
