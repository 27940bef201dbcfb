"""Page-numbered lists: ``count``, the page, and links to the next and previous pages."""

from __future__ import annotations

from collections.abc import Callable

from django.db.models import QuerySet
from ninja import Schema

MAX_PAGE = 100_000  # a page number past this is a mistake (and would overflow OFFSET)


class Paginated(Schema):
    count: int
    page: int
    page_size: int
    next: str | None
    previous: str | None


def _link(request, page: int) -> str:
    params = request.GET.copy()
    params["page"] = str(page)
    return request.build_absolute_uri(f"{request.path}?{params.urlencode()}")


def paginate(
    request, rows: QuerySet, *, page: int, page_size: int, item: Callable, prepare: Callable | None = None
) -> dict:
    """One page of ``rows``, each as ``item`` makes it; ``prepare`` is given the page's rows
    first, to look up what the items share in one query rather than one per item."""
    count = rows.count()
    start = (page - 1) * page_size
    chosen = list(rows[start : start + page_size])
    if prepare is not None:
        prepare(chosen)
    results = [item(row) for row in chosen]
    return {
        "count": count,
        "page": page,
        "page_size": page_size,
        "next": _link(request, page + 1) if start + page_size < count else None,
        "previous": _link(request, page - 1) if page > 1 else None,
        "results": results,
    }
