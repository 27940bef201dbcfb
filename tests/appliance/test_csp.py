"""Every page carries the Content-Security-Policy, and no page of the appliance holds an inline
script (the policy would block it: every script is one of its own files)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from inference.models import Job, JobKind, Queue
from tests.factories import ready_document

pytestmark = pytest.mark.django_db

INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.IGNORECASE)


def _pages(client: Client, paths: list[str]) -> dict[str, str]:
    pages = {}
    for path in paths:
        response = client.get(path)
        assert response.status_code == 200, path
        policy = response["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy.split("script-src", 1)[1].split(";")[0]
        assert "frame-ancestors 'none'" in policy and "object-src 'none'" in policy
        pages[path] = response.content.decode()
    return pages


def test_the_staff_and_user_pages_carry_the_policy_and_no_inline_script(alice):
    document = ready_document(alice, "lease", "The rent is 900 pounds a month.")
    job = Job.objects.create(owner=alice, kind=JobKind.SUMMARISE, queue=Queue.PREFILL, document=document,
                             state=Job.State.SUCCEEDED, result_text="**Rent**: 900 pounds.")  # fmt: skip
    user = Client()
    user.force_login(alice)
    pages = _pages(user, ["/documents/", f"/documents/{document.pk}/", "/draft", "/jobs/", f"/jobs/{job.pk}/",
                          "/account/tokens/", "/accounts/login/"])  # fmt: skip
    created = user.post("/account/tokens/", {"name": "a tool", "scopes": ["read"], "expires": "30"})
    pages["tokens, just created"] = created.content.decode()
    staff = Client()
    staff.force_login(User.objects.create_superuser("root", password="a long password indeed"))
    pages |= _pages(staff, ["/console/", "/admin/", "/admin/api/apitoken/"])
    for path, html in pages.items():
        assert not INLINE_SCRIPT.search(html), f"{path} holds an inline script: {INLINE_SCRIPT.search(html).group(0)}"
        assert "<script" in html or path.startswith(("/admin", "/accounts")), path  # the appliance's own files
