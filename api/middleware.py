"""405 in the API's format: django-ninja answers a method a path does not have with a bare
response; callers of the API get a problem, like every other error."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction
from django.utils.decorators import sync_and_async_middleware

from api.problems import CONTENT_TYPE, problem_response
from appliance.body_limit import API_PREFIXES


def _as_problem(request, response):
    if response.status_code != 405 or not request.path.startswith(API_PREFIXES):
        return response
    if response.get("Content-Type", "").startswith(CONTENT_TYPE):
        return response
    problem = problem_response(
        request,
        status=405,
        code="method-not-allowed",
        detail=f"{request.method} is not allowed on {request.path}; allowed: {response.get('Allow', 'none')}.",
    )
    if response.has_header("Allow"):
        problem["Allow"] = response["Allow"]
    return problem


@sync_and_async_middleware
def method_not_allowed_as_problem(get_response):
    if iscoroutinefunction(get_response):

        async def async_middleware(request):
            return _as_problem(request, await get_response(request))

        return async_middleware

    def middleware(request):
        return _as_problem(request, get_response(request))

    return middleware
