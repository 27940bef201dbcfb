"""Hybrid search over chunks: reads only, always filtered in SQL by who may read the documents.

Two arms, fused with reciprocal-rank fusion (Cormack et al., 2009):

- meaning: the query's embedding against ``Chunk.embedding`` by cosine distance. When the user
  may read many chunks, through the HNSW index (``hnsw.ef_search`` raised for recall,
  ``hnsw.iterative_scan`` so that the access filter does not leave the list short); when they
  may read only a few (``APPLIANCE_SEARCH_EXACT_MAX_CHUNKS``), exactly, over just those chunks:
  an index walk would have to pass over most of everyone else's chunks to find theirs;
- words: the query's significant terms (``significant_terms``: codes, numbers, words that are
  not function words), each as ``plainto_tsquery('english', term)``, OR-ed, against
  ``Chunk.search_vector`` (GIN; Unicode spaces and punctuation read as ASCII there), ranked by the terms a chunk holds, each weighed by its rarity
  among the passages searched (BM25's inverse document frequency, read from the term counts
  stored with each document's passages: ``documents.term_counts``) and by how often the chunk holds
  it (BM25's term frequency, with diminishing returns), then by ``ts_rank_cd``; this is what finds codes, names and numbers that embeddings blur, and it
  finds them in a long message too, whose words all together no passage has.

With ``APPLIANCE_SEARCH_RERANK`` (off by default: measured, it helps contracts and hurts
letters) the fused candidates are then reranked (``documents.rerank``): by the titles of the
clauses they are in and by how many of the question's terms they hold.

The documents the user may read (``readable_documents``, the rule of ``selectors``) are looked
up first, and their ids are a condition of every chunk query, never a filter applied afterwards
in Python: a passage of a document the user may not read is never even fetched. Literal ids,
rather than a subquery, let Postgres estimate how many chunks match and plan accordingly.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.conf import settings
from django.contrib.auth.models import User
from django.contrib.postgres.search import SearchQuery, SearchRank, SearchVector
from django.db import connection, transaction
from django.db.models import Case, F, FloatField, Func, Q, QuerySet, TextField, Value, When
from django.db.models.functions import Greatest, Least
from pgvector.django import CosineDistance

from documents.models import Chunk, Document
from documents.selectors import documents_readable_by
from documents.term_counts import passage_counts

# What the words arm indexes is the chunk's text with the characters below translated: Postgres's
# text-search parser, in the C locale the embedded cluster is made with, reads every character
# outside ASCII as a letter, so "Licensee\u2019s", "\u201cAgreement\u201d" and
# "Fox\u00a0shall\u00a0earn" were each one word, and none of their words could be found
# (PDFs printed from HTML, most EDGAR filings, put a no-break space between every word).
# Curly quotes and apostrophes read as ASCII ones, Unicode hyphens as "-", dashes, Unicode spaces
# and the punctuation and symbols of contracts and letters as spaces, a soft hyphen as nothing. The
# stored text is not changed (extraction already stores Unicode spaces as spaces: these are for
# documents stored before, and for the rest). U+200B is left: it sits inside words as often as
# between them.
_INDEX_AS = {
    "'": "\u2018\u2019\u201a\u201b\u2032",
    '"': "\u201c\u201d\u201e\u201f\u00ab\u00bb\u2039\u203a\u2033",
    "-": "\u2010\u2011\u2212",  # hyphens and the minus sign: "non\u2011compete" is "non-compete"
    # Dashes are spaces: Postgres reads "2019-2020" as 2019 and -2020, and no search for 2020 finds it.
    " ": "\u2012\u2013\u2014\u2015\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f"
    "\u205f\u3000\u2022\u00b7\u00a7\u00b6\u2020\u2021\u2026\u20ac\u00a3\u00a5\u00a9\u00ae\u2122\u00b0"
    "\u00b1\u00d7\u00f7",
}
INDEX_TRANSLATE_FROM = "".join(_INDEX_AS.values()) + "\u00ad"  # the soft hyphen, last: dropped
INDEX_TRANSLATE_TO = "".join(ascii * len(chars) for ascii, chars in _INDEX_AS.items())
# The same reading of a query, before its terms are taken: "XK\u201042\u2010ZULU" pasted with
# Unicode hyphens is the code "xk-42-zulu", as the index has it.
_QUERY_AS_INDEXED = str.maketrans(INDEX_TRANSLATE_FROM[:-1], INDEX_TRANSLATE_TO, "\u00ad")
SEARCH_CONFIG = "english"

RRF_K = 60  # the constant of reciprocal-rank fusion: score = sum over arms of 1 / (RRF_K + rank)
# Terms of a query the words arm matches, in order: enough for every term of a letter's queries,
# which are cut at 1,000 characters (``drafting.QUERY_MAX_CHARS``; those of the reply gold set
# have at most about 60), so that its later paragraphs count as much as its greeting and first
# lines did when only the first 24 were kept. The bound is for a longer text pasted into search.
MAX_QUERY_TERMS = 100
# How often a passage holds a term counts, with diminishing returns, as in BM25: a passage about
# service credits says "availability" five times, one that mentions it in passing once. The count
# is Postgres's own ``ts_rank`` of the passage for that term alone, which adds 1/n^2 for its n-th
# occurrence (weight D, 0.1, over pi^2/6): divided by its value for one occurrence, the factor is
# 1 for one, 1.25 for two, 1.36 for three, and never more than pi^2/6 (a hyphenated term's query
# is several lexemes and ranks otherwise: it is held within those bounds).
TS_RANK_ONCE = 0.1 / (math.pi**2 / 6)
TERM_FREQUENCY_MAX = math.pi**2 / 6
RERANK_PER_RESULT = 3  # candidates reranked per result asked for (at least 30)
RERANK_BEFORE_CHARS = 600  # of the passage before a candidate, read for the title it starts under
_TERM = re.compile(r"[A-Za-z0-9][A-Za-z0-9'\-_.]*[A-Za-z0-9]|[0-9]")
_FUNCTION_WORDS = frozenset(
    """the and for are but not you your yours our ours has have had was were will would shall should can could
    may might must this that these those there their them they then than what when where which who whom whose
    why how all any each some such with within without from into onto upon about above below after before
    over under again further once here also only very just too its it's is be been being do does did done
    dear thank thanks please kind regards sincerely faithfully would like could let know hope
    """.split()  # noqa: SIM905 - a list of words reads better as words
)


def chunk_search_vector() -> SearchVector:
    """What ``Chunk.search_vector`` is computed from: the chunk's text, its Unicode punctuation
    and spaces translated (``INDEX_TRANSLATE_FROM``)."""
    readable = Func(
        F("text"),
        Value(INDEX_TRANSLATE_FROM),
        Value(INDEX_TRANSLATE_TO),
        function="translate",
        output_field=TextField(),
    )
    return SearchVector(readable, config=SEARCH_CONFIG)


@dataclass(frozen=True)
class Passage:
    chunk_id: int
    document_id: int
    document_title: str
    page_start: int
    page_end: int
    text: str
    score: float  # higher is better, comparable within one search only (fused or reranked order)
    char_start: int
    char_end: int


def readable_documents(user: User | None, *, ready_only: bool = False) -> QuerySet[Document]:
    """Documents ``user`` may read: their own, and those shared with a group they are in (the
    rule of ``selectors.documents_readable_by``; one row per document). ``ready_only`` keeps
    those whose indexing is finished, as search wants."""
    if user is None or not user.is_authenticated:
        return Document.objects.none()
    documents = documents_readable_by(user)
    if ready_only:
        documents = documents.filter(state=Document.State.READY)
    return documents


def searchable_document_ids(user: User | None, document_ids: Sequence[int] | None = None) -> list[int]:
    """Ids of the ready documents ``user`` may read, limited to ``document_ids`` if given; with
    none given, a source's file that changed is searched as its latest version only."""
    documents = readable_documents(user, ready_only=True)
    if document_ids is not None:
        documents = documents.filter(pk__in=list(document_ids))
    else:
        documents = documents.filter(replaced_by__isnull=True)
    return list(documents.order_by().values_list("pk", flat=True))


def search_passages(
    *,
    user: User,
    query: str,
    limit: int = 10,
    document_ids: list[int] | None = None,
    embedder=None,
    rerank: bool | None = None,
) -> list[Passage]:
    """The passages that best answer ``query`` among the documents ``user`` may read, best first:
    the two arms fused, then the first candidates reranked by their clause titles and the
    question's terms (``documents.rerank``; ``APPLIANCE_SEARCH_RERANK``, or ``rerank``)."""
    query = (query or "").strip()
    if not query or limit < 1:
        return []
    readable = searchable_document_ids(user, document_ids)
    if not readable:
        return []
    if embedder is None:
        from documents.embeddings import get_embedder

        embedder = get_embedder()
    candidates = max(limit, settings.APPLIANCE_SEARCH_CANDIDATES)
    query_vector = embedder.encode([query])[0]
    by_meaning = [chunk_id for chunk_id, _ in _vector_arm(readable, query_vector, candidates)]
    by_words = [chunk_id for chunk_id, _ in _text_arm(readable, query, candidates)]
    fused = reciprocal_rank_fusion([by_meaning, by_words])
    if not fused:
        return []
    if settings.APPLIANCE_SEARCH_RERANK if rerank is None else rerank:
        kept = _reranked(readable, query, [chunk_id for chunk_id, _ in fused[: max(RERANK_PER_RESULT * limit, 30)]])
        fused = [(chunk_id, 1.0 / rank) for rank, chunk_id in enumerate(kept, 1)]
    fused = fused[:limit]
    scores = dict(fused)
    chunks = (
        Chunk.objects.filter(pk__in=list(scores), document_id__in=readable)
        .select_related("document")
        .only(
            "id", "document_id", "document__title", "page_start", "page_end", "text", "char_start", "char_end",
        )
    )  # fmt: skip
    passages = [
        Passage(
            chunk_id=chunk.pk,
            document_id=chunk.document_id,
            document_title=chunk.document.title,
            page_start=chunk.page_start,
            page_end=chunk.page_end,
            text=chunk.text,
            score=scores[chunk.pk],
            char_start=chunk.char_start,
            char_end=chunk.char_end,
        )
        for chunk in chunks
    ]
    passages.sort(key=lambda passage: (-passage.score, passage.chunk_id))
    return passages


def _reranked(document_ids: Sequence[int], query: str, chunk_ids: list[int]) -> list[int]:
    """``chunk_ids`` (fused order) reranked by ``documents.rerank``, each passage read with the
    end of the one before it (where the title of the clause it starts in is)."""
    from documents.rerank import Candidate, rerank

    rows = {
        pk: (document_id, index, text)
        for pk, document_id, index, text in Chunk.objects.filter(pk__in=chunk_ids, document_id__in=list(document_ids))
        .values_list("pk", "document_id", "index", "text")
    }  # fmt: skip
    wanted = Q()
    for document_id, index, _ in rows.values():
        if index > 0:
            wanted |= Q(document_id=document_id, index=index - 1)
    before = {}
    if wanted:
        before = {
            (document_id, index): text
            for document_id, index, text in Chunk.objects.filter(wanted).values_list("document_id", "index", "text")
        }
    candidates = [
        Candidate(pk, rows[pk][2], before.get((rows[pk][0], rows[pk][1] - 1), "")[-RERANK_BEFORE_CHARS:])
        for pk in chunk_ids
        if pk in rows
    ]
    return rerank(significant_terms(query), candidates)


def reciprocal_rank_fusion(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """Rankings of ids (best first) -> (id, fused score), best first; ties by id."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, 1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda pair: (-pair[1], pair[0]))


def vector_search(
    query_vector: np.ndarray | Sequence[float],
    *,
    limit: int,
    user: User | None,
    document_ids: Sequence[int] | None = None,
    ef_search: int | None = None,
) -> list[tuple[int, float]]:
    """(chunk id, cosine distance) of the chunks nearest to ``query_vector`` among those the user
    may read, nearest first: the meaning arm of ``search_passages`` on its own."""
    readable = searchable_document_ids(user, document_ids)
    if not readable:
        return []
    return _vector_arm(readable, query_vector, limit, ef_search=ef_search)


def text_search(
    query: str, *, limit: int, user: User | None, document_ids: Sequence[int] | None = None
) -> list[tuple[int, float]]:
    """(chunk id, weighed terms matched + ts_rank_cd) of the chunks the user may read that match
    any significant term of ``query``, best first: the words arm on its own."""
    readable = searchable_document_ids(user, document_ids)
    if not readable:
        return []
    return _text_arm(readable, query, limit)


def exact_vector_search(
    query_vector: np.ndarray | Sequence[float],
    limit: int,
    user: User | None = None,
    document_ids: Sequence[int] | None = None,
) -> list[tuple[int, float]]:
    """The true nearest chunks (a sequential scan, no index): the reference the benchmark
    measures the index search's recall against. ``user=None`` searches every chunk."""
    if user is None:
        chunks = Chunk.objects.all()
        if document_ids is not None:
            chunks = chunks.filter(document_id__in=list(document_ids))
    else:
        chunks = Chunk.objects.filter(document_id__in=searchable_document_ids(user, document_ids))
    with _local_settings({"enable_indexscan": "off", "enable_bitmapscan": "off"}):
        return _nearest(chunks, query_vector, limit)


def uses_exact_search(document_ids: Sequence[int]) -> bool:
    """Whether the meaning arm compares the query with every chunk of these documents rather
    than walking the HNSW index (they have few chunks). Counts at most the threshold + 1."""
    threshold = settings.APPLIANCE_SEARCH_EXACT_MAX_CHUNKS
    few = Chunk.objects.filter(document_id__in=list(document_ids)).order_by().values("pk")[: threshold + 1]
    return few.count() <= threshold


def nearest_queryset(document_ids: Sequence[int], query_vector, limit: int) -> QuerySet[Any, tuple[int, float]]:
    """The meaning arm's index query: (id, distance) of the nearest chunks of these documents.
    Ordered by distance alone: a second sort key would keep Postgres off the HNSW index."""
    return _nearest_queryset(
        Chunk.objects.filter(document_id__in=list(document_ids)), query_vector, limit, tie_break=False
    )


def explain_vector_search(query_vector: np.ndarray | Sequence[float], *, limit: int, user: User | None) -> str:
    """Postgres's plan for the meaning arm's query for this user (for benchmarks and support)."""
    readable = searchable_document_ids(user)
    if uses_exact_search(readable):
        with _local_settings(_EXACT_SETTINGS):
            return _nearest_queryset(Chunk.objects.filter(document_id__in=readable), query_vector, limit).explain()
    with _local_settings(_index_settings(None, limit)):
        return nearest_queryset(readable, query_vector, limit).explain()


# Index scans off: Postgres finds few documents' chunks through the document_id index (a bitmap
# scan) and sorts them by distance; the HNSW index is not used.
_EXACT_SETTINGS = {"enable_indexscan": "off"}


def _index_settings(ef_search: int | None, limit: int) -> dict[str, str]:
    if ef_search is None:
        ef_search = settings.APPLIANCE_SEARCH_EF_SEARCH
    ef_search = min(max(ef_search, limit), 1000)  # pgvector accepts 1..1000
    return {"hnsw.ef_search": str(ef_search), "hnsw.iterative_scan": "relaxed_order"}


def _vector_arm(
    document_ids: Sequence[int], query_vector, limit: int, *, ef_search: int | None = None
) -> list[tuple[int, float]]:
    if uses_exact_search(document_ids):
        with _local_settings(_EXACT_SETTINGS):
            return _nearest(Chunk.objects.filter(document_id__in=list(document_ids)), query_vector, limit)
    with _local_settings(_index_settings(ef_search, limit)):
        rows = [
            (chunk_id, float(distance)) for chunk_id, distance in nearest_queryset(document_ids, query_vector, limit)
        ]
    # relaxed_order may return the last few slightly out of order; the distances are exact.
    return sorted(rows, key=lambda row: (row[1], row[0]))


def significant_terms(query: str, *, limit: int = MAX_QUERY_TERMS) -> list[str]:
    """The words of ``query`` worth matching, in order, without repeats: codes and numbers
    ("XK-42-ZULU", "2024") and words of three letters or more that are not function words."""
    terms: dict[str, None] = {}
    for match in _TERM.finditer(query.translate(_QUERY_AS_INDEXED)):
        term = match.group(0).lower().strip("-_.'")
        if not term or term in _FUNCTION_WORDS or (len(term) < 3 and not term.isdigit()):
            continue
        terms.setdefault(term, None)
        if len(terms) >= limit:
            break
    return list(terms)


def _text_arm(document_ids: Sequence[int], query: str, limit: int) -> list[tuple[int, float]]:
    """Chunks that match *any* significant term of the query (a message's words all together
    almost never meet in one passage), ranked by the terms they hold, each weighed by how rare
    it is among the passages searched (``term_weights``: "assign" and "consent" say more about
    a passage of a contract than "party" and "agreement", which nearly every passage has) and by
    how often the passage holds it (``_term_score``), then by ``ts_rank_cd`` over them."""
    terms = significant_terms(query)
    if not terms:
        return []
    ids = list(document_ids)
    queries = [SearchQuery(term, search_type="plain", config=SEARCH_CONFIG) for term in terms]
    weights = term_weights(ids, terms)
    kept = [(q, w) for q, w in zip(queries, weights, strict=True) if w > 0]
    if not kept:
        return []
    anything = kept[0][0]
    for q, _ in kept[1:]:
        anything = anything | q
    coverage = sum((_term_score(q, w) for q, w in kept), start=Value(0.0, output_field=FloatField()))
    rows = (
        Chunk.objects.filter(document_id__in=ids, search_vector=anything)
        .annotate(coverage=coverage, rank=SearchRank(F("search_vector"), anything, cover_density=True))
        .order_by("-coverage", "-rank", "pk")
        .values_list("pk", "coverage", "rank")[:limit]
    )
    return [(chunk_id, float(covered) + float(rank)) for chunk_id, covered, rank in rows]


def _term_score(term: SearchQuery, weight: float) -> Case:
    """What one term adds to a passage's coverage: its weight (``term_weights``) times how often
    the passage holds it, counted as BM25 counts it, with diminishing returns (``TERM_FREQUENCY_*``),
    0 if the passage does not hold it."""
    once = Greatest(
        Value(1.0), Least(SearchRank(F("search_vector"), term) / Value(TS_RANK_ONCE), Value(TERM_FREQUENCY_MAX))
    )
    return Case(When(search_vector=term, then=Value(weight) * once), default=Value(0.0), output_field=FloatField())


def term_weights(document_ids: Sequence[int], terms: Sequence[str]) -> list[float]:
    """Each term's inverse document frequency among the passages of these documents, as BM25
    weighs it: ``log(1 + (N - n + 0.5) / (n + 0.5))`` for a term in ``n`` of ``N`` passages
    (those ``plainto_tsquery(SEARCH_CONFIG, term)`` matches); 0 for a term no passage has. The
    counts of all the terms are one query on the documents' stored term counts
    (``documents.term_counts``), not a full-text count per term."""
    total, counts = passage_counts(document_ids, terms, config=SEARCH_CONFIG)
    return [math.log(1.0 + (total - n + 0.5) / (n + 0.5)) if n else 0.0 for n in counts]


def _nearest_queryset(
    chunks: QuerySet[Chunk], query_vector, limit: int, *, tie_break: bool = True
) -> QuerySet[Any, tuple[int, float]]:
    vector = np.asarray(query_vector, dtype=np.float32)
    ordering = ("distance", "pk") if tie_break else ("distance",)
    return (
        chunks.filter(embedding__isnull=False)
        .annotate(distance=CosineDistance("embedding", vector))
        .order_by(*ordering)
        .values_list("pk", "distance")[:limit]
    )


def _nearest(chunks: QuerySet[Chunk], query_vector, limit: int) -> list[tuple[int, float]]:
    """Exact nearest (the callers turn index scans off)."""
    return [(chunk_id, float(distance)) for chunk_id, distance in _nearest_queryset(chunks, query_vector, limit)]


@contextmanager
def _local_settings(values: dict[str, str]) -> Iterator[None]:
    """Postgres settings for the queries inside, and only for them: ``SET LOCAL`` lasts to the
    end of the transaction, so inside a caller's transaction the old values are put back."""
    names = list(values)
    # Inside a caller's transaction our atomic block is only a savepoint, and SET LOCAL would
    # outlive it: then the old values are read first and put back after.
    outer = connection.in_atomic_block or not connection.get_autocommit()
    with transaction.atomic():
        old = None
        with connection.cursor() as cursor:
            if outer:
                cursor.execute("SELECT " + ", ".join(["current_setting(%s, true)"] * len(names)), names)
                old = cursor.fetchone()
            cursor.execute(
                "SELECT " + ", ".join(["set_config(%s, %s, true)"] * len(names)),
                [item for name in names for item in (name, values[name])],
            )
        yield
        # An unset extension setting reads as NULL; it is left as set (it only tunes the index).
        restore = [(name, value) for name, value in zip(names, old or (), strict=False) if value is not None]
        if restore:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT " + ", ".join(["set_config(%s, %s, true)"] * len(restore)),
                    [item for pair in restore for item in pair],
                )
