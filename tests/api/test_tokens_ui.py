"""``/account/tokens/`` and the admin's API tokens: created through ``token_create``, shown once,
revoked, recorded in the audit log."""

from __future__ import annotations

import hashlib
import re
from datetime import date, datetime, time, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from api import selectors, services
from api.models import ApiToken
from console.models import AuditEvent
from inference.models import Job, JobKind, Queue

pytestmark = pytest.mark.django_db

RAW_TOKEN = re.compile(r"dapp_[0-9a-f]{8}_[A-Za-z0-9_-]{20,}")


@pytest.fixture
def root():
    return get_user_model().objects.create_user(
        "root", password="pw-root-long-enough", is_staff=True, is_superuser=True
    )


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _raw_tokens_in(html: str) -> set[str]:
    return set(RAW_TOKEN.findall(html))


def test_the_page_creates_a_token_and_shows_it_once(alice, browser):
    response = browser.post("/account/tokens/", {"name": "Case system", "scopes": ["read", "write"], "expires": "30"})
    assert response.status_code == 200
    page = response.content.decode()
    (raw,) = _raw_tokens_in(page)
    token = ApiToken.objects.get(user=alice)
    assert token.token_sha256 == hashlib.sha256(raw.encode()).hexdigest()
    assert raw.startswith(token.prefix) and token.name == "Case system" and token.scopes == ["read", "write"]
    assert timedelta(days=29, hours=23) < token.expires_at - timezone.now() <= timedelta(days=30)
    assert "it will not be shown again" in page.lower()
    assert 'id="copy-token"' in page
    assert selectors.token_for(raw) == token  # a working token, not just a string
    # Not kept anywhere the browser sends back, and not cached.
    assert "no-store" in response["Cache-Control"]
    assert raw not in str(dict(browser.session.items()))
    assert all(raw not in morsel.value for morsel in response.cookies.values())

    later = browser.get("/account/tokens/").content.decode()
    assert raw not in later and not _raw_tokens_in(later)
    assert f"{token.prefix}…" in later and "Case system" in later


def test_expiry_never_on_a_date_and_a_missing_date(alice, browser):
    browser.post("/account/tokens/", {"name": "Forever", "scopes": ["read"], "expires": "never"})
    assert ApiToken.objects.get(name="Forever").expires_at is None

    day = timezone.localdate() + timedelta(days=10)
    browser.post("/account/tokens/", {"name": "Dated", "scopes": ["read"], "expires": "date", "expires_on": day})
    expected = datetime.combine(day, time.min, tzinfo=timezone.get_current_timezone())
    assert ApiToken.objects.get(name="Dated").expires_at == expected

    response = browser.post("/account/tokens/", {"name": "Undated", "scopes": ["read"], "expires": "date"})
    assert "Choose the date the token stops working." in response.content.decode()
    past = browser.post(
        "/account/tokens/", {"name": "Past", "scopes": ["read"], "expires": "date", "expires_on": date(2020, 1, 1)}
    )
    assert "The expiry date must be in the future." in past.content.decode()
    assert not _raw_tokens_in(past.content.decode())
    assert set(ApiToken.objects.values_list("name", flat=True)) == {"Forever", "Dated"}


def test_a_person_who_is_not_staff_cannot_create_an_admin_token(alice, browser, root):
    page = browser.get("/account/tokens/").content.decode()
    assert 'value="read"' in page and 'value="admin"' not in page  # not offered
    response = browser.post("/account/tokens/", {"name": "Sneaky", "scopes": ["read", "admin"], "expires": "7"})
    assert response.status_code == 200
    assert "Only staff accounts can have a token with the admin scope." in response.content.decode()
    assert not _raw_tokens_in(response.content.decode())
    assert not ApiToken.objects.exists() and not AuditEvent.objects.exists()
    empty = browser.post("/account/tokens/", {"name": " ", "scopes": [], "expires": "7"}).content.decode()
    assert "Choose at least one scope." in empty and not ApiToken.objects.exists()

    staff = _client(root)
    assert 'value="admin"' in staff.get("/account/tokens/").content.decode()
    staff.post("/account/tokens/", {"name": "Usage report", "scopes": ["admin"], "expires": "7"})
    assert ApiToken.objects.get(user=root).scopes == ["admin"]


def test_revoking_a_token_and_someone_elses_is_not_found(alice, browser, root):
    mine, raw = services.token_create(user=alice, name="Mail plug-in", scopes=["read"])
    theirs, their_raw = services.token_create(user=root, name="Root's script", scopes=["read"])

    assert browser.get(f"/account/tokens/{mine.pk}/revoke").status_code == 405  # only by POST
    response = browser.post(f"/account/tokens/{mine.pk}/revoke")
    assert response.status_code == 302 and response["Location"] == "/account/tokens/"
    mine.refresh_from_db()
    assert mine.revoked_at is not None and selectors.token_for(raw) is None
    page = browser.get("/account/tokens/").content.decode()
    assert "is revoked; requests with it now fail" in page
    row = page.split(f'data-token-id="{mine.pk}"', 1)[1].split("</tr>", 1)[0]
    assert "Revoked" in row and "/revoke" not in row  # no second revoke button
    again = browser.post(f"/account/tokens/{mine.pk}/revoke", follow=True).content.decode()
    assert "was revoked already" in again

    assert browser.post(f"/account/tokens/{theirs.pk}/revoke").status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None and selectors.token_for(their_raw) == theirs
    assert "Root&#x27;s script" not in page and "Root's script" not in page  # nor listed
    assert AuditEvent.objects.filter(action="token_revoke").count() == 1


def test_the_page_needs_a_signed_in_person():
    for method, path in (("get", "/account/tokens/"), ("post", "/account/tokens/1/revoke")):
        response = getattr(Client(), method)(path)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert not ApiToken.objects.exists()


def test_creating_and_revoking_are_in_the_audit_log_and_its_filters(alice, browser, root):
    browser.post("/account/tokens/", {"name": "Case system", "scopes": ["read"], "expires": "7"})
    token = ApiToken.objects.get(user=alice)
    browser.post(f"/account/tokens/{token.pk}/revoke")
    events = list(AuditEvent.objects.order_by("at").values_list("username", "action", "target"))
    assert events == [
        ("alice", "token_create", f"Case system ({token.prefix}…)"),
        ("alice", "token_revoke", f"Case system ({token.prefix}…)"),
    ]
    created = AuditEvent.objects.get(action="token_create")
    assert created.detail["scopes"] == ["read"] and created.detail["prefix"] == token.prefix

    admin = _client(root)
    page = admin.get("/console/audit", {"action": "token_create"}).content.decode()
    assert '<option value="token_create" selected>created API token</option>' in page
    table = page.split('id="audit-table"', 1)[1]
    assert "<td>created API token</td>" in table and "<td>revoked API token</td>" not in table
    table = admin.get("/console/audit", {"action": "token_revoke"}).content.decode().split('id="audit-table"', 1)[1]
    assert "<td>revoked API token</td>" in table and "<td>created API token</td>" not in table


def test_the_admin_creates_a_hashed_token_and_shows_it_once(alice, root):
    admin = _client(root)
    form = admin.get("/admin/api/apitoken/add/").content.decode()
    assert 'name="token_sha256"' not in form and 'name="prefix"' not in form
    response = admin.post(
        "/admin/api/apitoken/add/",
        {"user": alice.pk, "name": "Scanner", "scopes": ["write"], "rate_limit_per_minute": "30"},
        follow=True,
    )
    assert response.status_code == 200
    page = response.content.decode()
    (raw,) = _raw_tokens_in(page)
    token = ApiToken.objects.get(user=alice)
    assert token.token_sha256 == hashlib.sha256(raw.encode()).hexdigest()
    assert token.scopes == ["write"] and token.rate_limit_per_minute == 30 and token.expires_at is None
    assert "it will not be shown again" in page
    event = AuditEvent.objects.get(action="token_create")
    assert event.username == "root" and event.detail["owner"] == "alice"

    change = admin.get(f"/admin/api/apitoken/{token.pk}/change/").content.decode()
    assert raw not in change and token.token_sha256 not in change and not _raw_tokens_in(change)
    assert 'name="scopes"' not in change and 'name="user"' not in change  # fixed once issued
    admin.post(
        f"/admin/api/apitoken/{token.pk}/change/",
        {"name": "Scanner (2nd floor)", "rate_limit_per_minute": "60", "expires_at_0": "", "expires_at_1": ""},
    )
    token_after = ApiToken.objects.get(pk=token.pk)
    assert token_after.name == "Scanner (2nd floor)" and token_after.rate_limit_per_minute == 60
    assert token_after.token_sha256 == token.token_sha256 and token_after.scopes == ["write"]


def test_the_admin_refuses_an_admin_token_for_someone_who_is_not_staff(alice, root):
    response = _client(root).post("/admin/api/apitoken/add/", {"user": alice.pk, "name": "Usage", "scopes": ["admin"]})
    assert response.status_code == 200  # the form again
    assert "Only staff accounts can have a token with the admin scope." in response.content.decode()
    assert not ApiToken.objects.exists() and not AuditEvent.objects.exists()


def test_the_admin_revokes_selected_tokens_with_change_permission(alice, root):
    first, _ = services.token_create(user=alice, name="One", scopes=["read"])
    second, _ = services.token_create(user=alice, name="Two", scopes=["read"])
    kept, kept_raw = services.token_create(user=alice, name="Kept", scopes=["read"])

    viewer = get_user_model().objects.create_user("vera", password="pw-vera-long-enough", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_apitoken"))
    _client(viewer).post("/admin/api/apitoken/", {"action": "revoke", "_selected_action": [str(first.pk)]})
    first.refresh_from_db()
    assert first.revoked_at is None  # view permission alone does not revoke

    response = _client(root).post(
        "/admin/api/apitoken/", {"action": "revoke", "_selected_action": [str(first.pk), str(second.pk)]}, follow=True
    )
    assert "2 token(s) revoked." in response.content.decode()
    assert set(ApiToken.objects.filter(revoked_at__isnull=False).values_list("name", flat=True)) == {"One", "Two"}
    assert selectors.token_for(kept_raw) == kept
    assert sorted(AuditEvent.objects.filter(action="token_revoke").values_list("target", flat=True)) == [
        str(first),
        str(second),
    ]


def test_the_admin_lists_and_filters_tokens_and_jobs_by_token(alice, root):
    active, _ = services.token_create(user=alice, name="Active one", scopes=["read"])
    revoked, _ = services.token_create(user=alice, name="Revoked one", scopes=["write"])
    services.token_revoke(token=revoked)
    expired, _ = services.token_create(user=root, name="Expired one", scopes=["admin"])
    ApiToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(days=1))
    admin = _client(root)

    def names(query: dict) -> set[str]:
        response = admin.get("/admin/api/apitoken/", query)
        assert response.status_code == 200
        return {token.name for token in response.context["cl"].result_list}

    assert names({"status": "active"}) == {"Active one"}
    assert names({"status": "revoked"}) == {"Revoked one"}
    assert names({"status": "expired"}) == {"Expired one"}
    assert names({"scope": "write"}) == {"Revoked one"}
    assert names({"user__is_staff__exact": "1"}) == {"Expired one"}
    assert names({"q": active.prefix}) == {"Active one"}
    assert names({"q": "alice"}) == {"Active one", "Revoked one"}

    with_token = Job.objects.create(owner=alice, kind=JobKind.CHAT, queue=Queue.DECODE, api_token=active)
    Job.objects.create(owner=alice, kind=JobKind.CHAT, queue=Queue.DECODE)
    jobs = admin.get("/admin/inference/job/", {"api_token__id__exact": active.pk}).context["cl"].result_list
    assert [job.pk for job in jobs] == [with_token.pk]
    jobs = admin.get("/admin/inference/job/", {"api_token__isempty": "0"}).context["cl"].result_list
    assert [job.pk for job in jobs] == [with_token.pk]
    change = admin.get(f"/admin/api/apitoken/{active.pk}/change/").content.decode()
    assert f"?api_token__id__exact={active.pk}" in change and "1 job(s) started with this token" in change


def test_only_a_superuser_issues_a_token_for_someone_else_in_the_admin(alice, django_user_model):
    from django.contrib.auth.models import Permission

    clerk = django_user_model.objects.create_user(username="clerk", password="pw-clerk-long-enough", is_staff=True)
    clerk.user_permissions.add(*Permission.objects.filter(codename__in=["add_apitoken", "view_apitoken"]))
    admin = _client(clerk)
    response = admin.post("/admin/api/apitoken/add/", {"user": alice.pk, "name": "Alice's", "scopes": ["read"]})
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    assert not ApiToken.objects.filter(user=alice).exists()
    admin.post("/admin/api/apitoken/add/", {"user": clerk.pk, "name": "Mine", "scopes": ["read"]})
    assert ApiToken.objects.get(user=clerk).name == "Mine"
