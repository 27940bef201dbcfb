"""``/console``: the administrator's pages (staff only). Reads only; actions live in the admin."""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.paginator import Paginator
from django.shortcuts import render

from console import selectors
from console.models import AuditEvent

AUDIT_PAGE_SIZE = 50


def staff_only(view):
    """Anonymous: sign in first. Signed in but not staff: 403, with a page that says why."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not request.user.is_staff:
            return render(request, "console/forbidden.html", status=403)
        return view(request, *args, **kwargs)

    return wrapper


@staff_only
def overview(request):
    series = selectors.latency_series()
    return render(
        request,
        "console/overview.html",
        {
            "engine": selectors.engine(),
            "queues": selectors.queues(),
            "latency": selectors.latency(),
            "chart": selectors.chart(series),
            "failures": selectors.failures(),
            "failure_reasons": selectors.failure_reasons(),
            "usage": selectors.usage_per_user(),
            "usage_per_token": selectors.usage_per_token(),
        },
    )


@staff_only
def audit_log(request):
    if not request.user.has_perm("console.view_auditevent"):  # titles, sharing and addresses of everyone
        return render(request, "console/forbidden.html", {"audit": True}, status=403)
    events = AuditEvent.objects.all()
    username = request.GET.get("user", "").strip()
    action = request.GET.get("action", "")
    if username:
        events = events.filter(username=username)
    if action in AuditEvent.Action.values:
        events = events.filter(action=action)
    page = Paginator(events, AUDIT_PAGE_SIZE).get_page(request.GET.get("page"))
    return render(
        request,
        "console/audit.html",
        {"page": page, "actions": AuditEvent.Action.choices, "filters": {"user": username, "action": action}},
    )
