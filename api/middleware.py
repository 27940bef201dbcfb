"""413 before the body is read: an API upload whose declared length is over the limit is refused
without writing a byte of it to disk."""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.utils.decorators import sync_and_async_middleware

from api.problems import problem_response

MULTIPART_OVERHEAD_BYTES = 64 * 1024  # boundaries and headers of a one-file form


def _too_large(request):
    if not request.path.startswith(("/api/", "/v1/")):
        return None
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    limit_mb = settings.APPLIANCE_MAX_UPLOAD_MB
    if length <= limit_mb * 1024 * 1024 + MULTIPART_OVERHEAD_BYTES:
        return None
    return problem_response(
        request,
        status=413,
        code="upload-too-large",
        detail=f"The request is {length / 1024 / 1024:.1f} MB; the upload limit is {limit_mb} MB.",
    )


@sync_and_async_middleware
def api_upload_size_limit(get_response):
    if iscoroutinefunction(get_response):

        async def middleware(request):
            return _too_large(request) or await get_response(request)

    else:

        def middleware(request):
            return _too_large(request) or get_response(request)

    return middleware
