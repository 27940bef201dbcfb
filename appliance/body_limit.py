"""Refuse a request body over the limit before Django reads it.

Under an ASGI server Django reads the whole body into a temporary file before any middleware or
view runs, and before anyone is authenticated: a Django-level check would come after the disk
had filled. This wrapper answers 413 from the ``Content-Length`` header, and cuts off a body
without one (chunked) as soon as it passes the limit.

Limits, by path: the API's upload carries one file (``APPLIANCE_MAX_UPLOAD_MB`` plus room for the
form); the library's upload form and ``/api/v1/batches`` may carry several, up to
``BROWSER_UPLOAD_FILES`` of them (a zip of a folder is one); the draft form one letter file. Every other request (sign-in, JSON, forms) is held to Django's own
``DATA_UPLOAD_MAX_MEMORY_SIZE``: the sign-in page accepting a gigabyte before anyone is signed
in would let anyone fill the disk.
"""

from __future__ import annotations

import json

API_PREFIXES = ("/api/", "/v1/")
FORM_OVERHEAD_BYTES = 64 * 1024
BROWSER_UPLOAD_FILES = 10


# Paths that take files, without their trailing slash, and how many files each may carry.
UPLOAD_PATHS = {
    "/api/v1/documents": 1,
    "/api/v1/batches": BROWSER_UPLOAD_FILES,  # several files, or a zip (one file) of a folder
    "/documents": BROWSER_UPLOAD_FILES,
    "/draft": 1,
}


def limit_bytes(path: str) -> int:
    from django.conf import settings

    files = UPLOAD_PATHS.get(path.rstrip("/"))
    if files is None:
        return settings.DATA_UPLOAD_MAX_MEMORY_SIZE + FORM_OVERHEAD_BYTES
    return files * settings.APPLIANCE_MAX_UPLOAD_MB * 1024 * 1024 + FORM_OVERHEAD_BYTES


def _declared_length(scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(scope, send, limit: int) -> None:
    from django.conf import settings

    path = scope.get("path", "")
    detail = f"The request body is over the limit of {limit // (1024 * 1024)} MB here"
    detail += (
        f" (uploads: {settings.APPLIANCE_MAX_UPLOAD_MB} MB a file)."
        if path.rstrip("/") in UPLOAD_PATHS
        else "; files are uploaded to the library or POST /api/v1/documents."
    )
    if path.startswith(API_PREFIXES):
        from api.problems import CONTENT_TYPE, problem_body

        body = json.dumps(problem_body(status=413, code="upload-too-large", detail=detail, instance=path)).encode()
        content_type = CONTENT_TYPE.encode()
    else:
        body, content_type = detail.encode(), b"text/plain; charset=utf-8"
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class BodySizeLimit:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = limit_bytes(scope.get("path", ""))
        declared = _declared_length(scope)
        if declared is not None and declared > limit:
            return await _refuse(scope, send, limit)
        received = 0
        refused = False

        async def limited_receive():
            nonlocal received, refused
            message = await receive()
            if message["type"] == "http.request" and not refused:
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    await _refuse(scope, send, limit)
                    return {"type": "http.disconnect"}  # Django stops reading and answers nothing more
            return message

        return await self.app(scope, limited_receive, send)
