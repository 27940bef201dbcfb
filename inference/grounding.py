"""The passages a drafted reply may rest on: search restricted to what its author may read.

The scope is checked twice. When the job is created (``draft_scope`` refuses documents and
groups the user cannot see, in words that do not reveal whether they exist), and again when the
worker retrieves, because sharing can change while the job waits: retrieval goes through
``documents.search.search_passages`` with the job's owner, which filters in SQL by the owner's
access as it is at that moment. Nothing in a document (nor in the incoming message) takes part in
choosing which documents are searched: the scope is ids and a group, fixed by the person.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.contrib.auth.models import User

from documents.search import Passage, readable_documents, search_passages
from inference.drafting import DRAFT_PASSAGES, fuse_by_passage_and_document, retrieval_queries
from inference.job_results import PassageRecord
from inference.prompts import NumberedPassage, passage_source

CANDIDATES_PER_QUERY = 12


class ScopeRejected(ValueError):
    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    """The documents or group chosen are not ones the user may ground a reply on."""


@dataclass(frozen=True)
class Scope:
    document_ids: tuple[int, ...] = ()  # chosen documents; empty with no group: all the user may read
    group_id: int | None = None  # a collection: the documents shared with one of the user's groups

    def describe(self) -> str:
        if self.document_ids:
            return f"{len(self.document_ids)} chosen document(s)"
        if self.group_id is not None:
            return "the documents of a group"
        return "every document you may read"


def draft_scope(*, user: User, document_ids: Sequence[int] = (), group_id: int | None = None) -> Scope:
    """The scope a person chose, checked against what they may read now."""
    ids = tuple(dict.fromkeys(int(pk) for pk in document_ids))
    if ids:
        readable = set(readable_documents(user).filter(pk__in=ids).values_list("pk", flat=True))
        missing = [pk for pk in ids if pk not in readable]
        if missing:
            raise ScopeRejected(f"No such document: {', '.join(map(str, missing))}.", field="document_ids")
    if group_id is not None and not user.groups.filter(pk=group_id).exists():
        raise ScopeRejected("You are not a member of that group.", field="group_id")
    scope = Scope(document_ids=ids, group_id=group_id)
    if not scope_document_ids(user=user, scope=scope):
        raise ScopeRejected(
            f"There is nothing to ground the reply on: none of {scope.describe()} is ready for search yet."
        )
    return scope


def scope_document_ids(*, user: User, scope: Scope) -> list[int]:
    """Ids of the ready documents in the scope that ``user`` may read at this moment."""
    documents = readable_documents(user, ready_only=True)
    if scope.document_ids:
        documents = documents.filter(pk__in=scope.document_ids)
    if scope.group_id is not None:
        documents = documents.filter(shared_with__pk=scope.group_id)
    return list(documents.order_by().values_list("pk", flat=True).distinct())


def retrieve(
    *,
    user: User,
    message: str,
    scope: Scope,
    limit: int = DRAFT_PASSAGES,
    embedder=None,
    rerank: bool | None = None,
) -> list[Passage]:
    """The passages that best answer ``message``, best first: one search per query of
    ``drafting.retrieval_queries``, fused by rank and by document
    (``drafting.fuse_by_passage_and_document``). (Making the first six include each point's best
    passage, whatever fusion said, lowered the reply gold set's recall@6 in every variant
    tried: 0.688 against 0.781; a point's own first passage is often not its answer.)"""
    ids = scope_document_ids(user=user, scope=scope)
    if not ids:
        return []
    found: dict[int, Passage] = {}
    rankings = []
    for query in retrieval_queries(message):
        passages = search_passages(
            user=user, query=query, limit=CANDIDATES_PER_QUERY, document_ids=ids, embedder=embedder, rerank=rerank
        )
        rankings.append([p.chunk_id for p in passages])
        for passage in passages:
            found.setdefault(passage.chunk_id, passage)
    document_of = {chunk_id: passage.document_id for chunk_id, passage in found.items()}
    return [found[chunk_id] for chunk_id in fuse_by_passage_and_document(rankings, document_of)[:limit]]


def numbered(passages: Sequence[Passage]) -> list[NumberedPassage]:
    return [
        NumberedPassage(number, passage_source(p.document_title, p.page_start, p.page_end), p.text)
        for number, p in enumerate(passages, start=1)
    ]


def passage_record(number: int, passage: Passage) -> PassageRecord:
    """What a job keeps of a passage it cited: enough to link it and to show it (its score is
    not kept). ``PassageRecord.numbered`` gives the passage back as the model saw it."""
    return PassageRecord(
        number=number,
        chunk_id=passage.chunk_id,
        document_id=passage.document_id,
        document_title=passage.document_title,
        page_start=passage.page_start,
        page_end=passage.page_end,
        text=passage.text,
        char_start=passage.char_start,
        char_end=passage.char_end,
    )


def readable_ids(user: User, document_ids: Sequence[int]) -> set[int]:
    """Which of these documents ``user`` may read now (a citation to the others is not linked)."""
    return set(readable_documents(user).filter(pk__in=list(document_ids)).values_list("pk", flat=True))
