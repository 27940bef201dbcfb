"""Pages of the API outside the schema: what a problem type means, and 404 for unknown paths."""

from __future__ import annotations

from django.http import Http404, HttpResponse, JsonResponse

from api.problems import PROBLEM_TYPES, problem_response


def problem_type(request, code: str):
    """The page a problem's ``type`` URI points at: its title and what to do."""
    if code not in PROBLEM_TYPES:
        raise Http404("No such problem type.")
    title, meaning = PROBLEM_TYPES[code]
    return HttpResponse(f"{title}\n\n{meaning}\n", content_type="text/plain; charset=utf-8")


def openapi_schema(request):
    """The OpenAPI 3 schema, for any caller: tools generate clients from it (the docs page that
    renders it is for staff)."""
    from api.site import api

    return JsonResponse(api.get_openapi_schema(), json_dumps_params={"ensure_ascii": False})


def api_not_found(request):
    return problem_response(request, status=404, code="not-found", detail=f"No API endpoint at {request.path}.")
