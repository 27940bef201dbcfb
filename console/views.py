"""``/console``: the administrator's pages (staff only). Reads only; actions live in the admin."""

from __future__ import annotations

from datetime import datetime
from functools import wraps
from pathlib import Path
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.paginator import Paginator
from django.http import FileResponse, Http404
from django.shortcuts import render
from django.urls import reverse

from console import selectors
from console.forms import CapacityForm
from console.models import AuditEvent
from inference.capacity import GIB, KNOWN_SHAPES, SHAPE_FIELDS, ShapeError

AUDIT_PAGE_SIZE = 50
PRESET_MEMORY_GIB = (24, 48, 80)
# Fields of the planner's form a preset link keeps from the form as it is.
PRESET_KEEPS = ("kv_dtype", "context_tokens", "memory_utilization")
SPECSHEET_CONTENT_TYPES = {".png": "image/png", ".json": "application/json", ".md": "text/markdown; charset=utf-8"}
CHART_ALT = {
    "ttft": "Chart: time to first token, p50 and p95, against the number of concurrent users, one line per "
    "profile, with the target; the same figures are in the tables above.",
    "tokens_per_s": "Chart: output tokens per second per user (median) against the number of concurrent "
    "users, one line per profile, with the target and the single-user decode ceiling; the same figures are in "
    "the tables above.",
}
HARDWARE_LABELS = {
    "device": "Device",
    "device_name": "Device name",
    "device_count": "Devices",
    "device_memory_bytes": "Device memory",
    "cpu": "CPU",
    "cpus": "CPU cores",
    "ram_bytes": "Memory (RAM)",
    "driver": "Driver",
    "cuda": "CUDA",
    "vllm": "vLLM",
    "torch": "PyTorch",
    "python": "Python",
    "platform": "Platform",
}


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
            "nodes": selectors.cluster_nodes(),
            "queues": selectors.queues(),
            "latency": selectors.latency(),
            "chart": selectors.chart(series),
            "failures": selectors.failures(),
            # Who failed at what (document titles, user names) is for those who may read jobs in
            # the admin; other staff see when, which kind and why.
            "may_see_jobs": request.user.has_perm("inference.view_job"),
            "failure_reasons": selectors.failure_reasons(),
            "usage": selectors.usage_per_user(),
            "usage_per_token": selectors.usage_per_token(),
            "specsheet": _specsheet_page(selectors.latest_specsheet()),
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


@staff_only
def capacity(request):
    """The capacity planner (``inference.capacity``) with what the form gives, the served
    model, this machine's memory and the configured context for what it leaves empty; beside it,
    what the running engine reports and the planner's figure for the same KV memory."""
    stats = selectors.engine()  # asked once: the defaults, the plan and the comparison use it
    form = CapacityForm(request.GET)
    form.show_defaults(
        memory_gib=f"{selectors.default_device_memory_bytes(stats) / GIB:.1f}",
        context_tokens=settings.APPLIANCE_MAX_MODEL_LEN,
        memory_utilization=selectors.DEFAULT_MEMORY_UTILIZATION,
        gpus_per_engine=settings.APPLIANCE_TENSOR_PARALLEL_SIZE,
        engines=selectors.cluster_engine_count(),
    )
    result = None
    if form.is_valid():
        arguments = form.plan_arguments()
        try:
            result = selectors.capacity_plan(**arguments, engine_stats=stats)
        except ShapeError as exc:
            if any(arguments[name] is not None for name in SHAPE_FIELDS):
                for name in exc.fields:
                    form.add_error(name, str(exc))
            else:  # the served model, unreadable: no field of the form is wrong (staff may read why)
                form.add_error(None, f"{exc}. {exc.__cause__}" if exc.__cause__ else str(exc))
    check = selectors.served_model_check(stats)
    return render(
        request,
        "console/capacity.html",
        {
            "form": form,
            "shape_fields": SHAPE_FIELDS,
            "served_model": Path(settings.APPLIANCE_MODEL).name,
            "plan": result,
            "figures": _plan_figures(result) if result else None,
            "served": result is not None and all(request.GET.get(name) in (None, "") for name in SHAPE_FIELDS),
            "presets": _presets(form),
            "engine": selectors.engine_capacity(stats, check),
            "check": check,
            "check_figures": _plan_figures(check["plan"]) if check else None,
        },
    )


def _plan_figures(plan) -> dict:
    return {
        "parameters": f"{plan.shape.parameters / 1e9:.2f} billion"
        if plan.shape.parameters >= 1e9
        else f"{plan.shape.parameters / 1e6:.1f} million",
        "weight_gb": plan.weight_bytes / 1e9,
        "weight_gib": plan.weight_bytes / GIB,
        "kv_kib_per_token": plan.kv_bytes_per_token / 1024,
        "device_memory_gib": plan.device_memory_bytes / GIB,
        "usable_gib": plan.device_memory_bytes * plan.gpus_per_engine * plan.memory_utilization / GIB,
        "utilization_percent": plan.memory_utilization * 100,
        "kv_budget_gib": plan.kv_budget_bytes / GIB,
    }


def _presets(form: CapacityForm) -> list[dict]:
    """Links to the planner with a well-known model's shape on a device of 24, 48 or 80 GiB,
    keeping the KV precision, context and utilisation the form has now (when they are valid)."""
    keep = {
        name: form.data[name]
        for name in PRESET_KEEPS
        if form.data.get(name) and name in getattr(form, "cleaned_data", {})
    }
    url = reverse("console:capacity")
    presets = []
    for name, shape in KNOWN_SHAPES.items():
        query = {
            "layers": shape.layers,
            "kv_heads": shape.kv_heads,
            "head_dim": shape.head_dim,
            "parameters": f"{shape.parameters / 1e9:g}e9",
            "weight_dtype": shape.weight_dtype,
        }
        links = [
            {"memory_gib": gib, "url": f"{url}?{urlencode({**query, 'memory_gib': gib, **keep})}"}
            for gib in PRESET_MEMORY_GIB
        ]
        presets.append(
            {"name": name, "shape": shape, "parameters": f"{shape.parameters / 1e9:g} billion", "links": links}
        )
    return presets


@staff_only
def specsheet(request):
    return render(request, "console/specsheet.html", {"sheet": _specsheet_page(selectors.latest_specsheet())})


@staff_only
def specsheet_file(request, name: str):
    """A chart, the Markdown or the JSON of a spec sheet; nothing else from anywhere else."""
    path = selectors.specsheet_file(name)
    if path is None:
        raise Http404("No such spec sheet file.")
    return FileResponse(
        path.open("rb"),
        content_type=SPECSHEET_CONTENT_TYPES[path.suffix],
        as_attachment=path.suffix != ".png",
        filename=path.name,
    )


def _specsheet_page(sheet: dict | None) -> dict | None:
    """The spec sheet ``manage.py specsheet`` wrote, as the page shows it: any part may be missing
    or null (a sheet of an older version, a profile whose requests all failed)."""
    if not sheet:
        return None
    targets = _mapping(sheet.get("targets"))
    ceiling = _mapping(sheet.get("decode_ceiling"))
    hardware = _mapping(sheet.get("hardware"))
    charts = _mapping(sheet.get("charts"))
    files = _mapping(sheet.get("files"))
    return {
        "version": sheet.get("version"),
        "started_at": _datetime(sheet.get("started_at")),
        "finished_at": _datetime(sheet.get("finished_at")),
        "duration": _duration(sheet.get("duration_s")),
        "quick": bool(sheet.get("quick")),
        "answers": [
            {"key": a.get("key"), "question": a.get("question") or a.get("key"), "answer": a.get("answer")}
            for a in _list(sheet.get("answers"))
            if isinstance(a, dict)
        ],
        "targets": {
            "ttft_s": _scaled(targets.get("ttft_ms"), 1 / 1000),
            "itl_ms": _number(targets.get("itl_ms")),
            "min_goodput_percent": _scaled(targets.get("min_goodput"), 100),
        },
        "profiles": [
            _profile(key, profile)
            for key, profile in _mapping(sheet.get("profiles")).items()
            if isinstance(profile, dict)
        ],
        "decode_ceiling": {
            "bandwidth_gb_s": _number(ceiling.get("bandwidth_gb_s")),
            "bandwidth_source": ceiling.get("bandwidth_source"),
            "mb_per_step": _scaled(ceiling.get("bytes_per_step"), 1e-6),
            "ceiling_tokens_per_s": _number(ceiling.get("ceiling_tokens_per_s")),
            "measured_tokens_per_s": _number(ceiling.get("measured_tokens_per_s")),
            "share_percent": _scaled(ceiling.get("share_of_ceiling"), 100),
        }
        if ceiling
        else None,
        "hardware": [
            {
                "label": HARDWARE_LABELS.get(key, key.replace("_", " ").capitalize()),
                "value": f"{value / GIB:.1f} GiB" if key.endswith("_bytes") and _number(value) is not None else value,
            }
            for key, value in hardware.items()
            if value not in (None, "")
        ],
        "charts": [
            {"url": _file_url(charts.get(key)), "alt": alt}
            for key, alt in CHART_ALT.items()
            if _file_url(charts.get(key))
        ],
        "markdown_url": _file_url(files.get("markdown")),
        "json_url": _file_url(files.get("json")),
    }


def _profile(key: str, profile: dict) -> dict:
    levels = []
    for level in _list(profile.get("levels")):
        if not isinstance(level, dict):
            continue
        meets = level.get("meets_target")
        levels.append(
            {
                "concurrency": level.get("concurrency"),
                "requests": level.get("requests"),
                "failed": level.get("failed"),
                "ttft_p50_s": _scaled(level.get("ttft_p50_ms"), 1 / 1000),
                "ttft_p95_s": _scaled(level.get("ttft_p95_ms"), 1 / 1000),
                "itl_p50_ms": _number(level.get("itl_p50_ms")),
                "itl_p95_ms": _number(level.get("itl_p95_ms")),
                "tokens_per_s_per_user": _number(level.get("tokens_per_s_per_user")),
                "aggregate_tokens_per_s": _number(level.get("aggregate_tokens_per_s")),
                "requests_per_s": _number(level.get("requests_per_s")),
                "goodput_percent": _scaled(level.get("goodput"), 100),
                "meets_target": None if meets is None else bool(meets),
            }
        )
    inputs, outputs = _mapping(profile.get("inputs")), _mapping(profile.get("outputs"))
    if profile.get("input_tokens") is not None:
        requests = [
            {"kind": None, "input_tokens": profile["input_tokens"], "output_tokens": profile.get("output_tokens")}
        ]
    else:  # the mixed profile: a kind of request per kind of user
        requests = [
            {"kind": kind, "input_tokens": tokens, "output_tokens": outputs.get(kind)}
            for kind, tokens in inputs.items()
        ]
    return {
        "key": key,
        "label": profile.get("label") or key.capitalize(),
        "description": profile.get("description"),
        "queue": profile.get("queue"),
        "requests": requests,
        "requests_per_user": profile.get("requests_per_user"),
        "users_served": profile.get("users_served"),
        "stopped": profile.get("stopped"),
        "levels": levels,
    }


def _mapping(value) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value) -> list:
    return value if isinstance(value, list) else []


def _number(value) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _scaled(value, factor: float) -> float | None:
    number = _number(value)
    return None if number is None else number * factor


def _datetime(value) -> dict | None:
    """An ISO 8601 time: as written, and as a datetime (shown in the appliance's time zone) if it is one."""
    if not isinstance(value, str) or not value:
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        at = None
    return {"iso": value, "at": at}


def _duration(seconds) -> str | None:
    seconds = _number(seconds)
    if seconds is None:
        return None
    minutes, rest = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def _file_url(name) -> str | None:
    """The URL of a spec sheet's file, for names the file view serves."""
    if not isinstance(name, str) or not selectors.SPECSHEET_FILE_NAME.fullmatch(name):
        return None
    return reverse("console:specsheet_file", args=[name])
