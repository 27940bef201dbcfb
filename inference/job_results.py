"""The result of each kind of job, as one type used where a job's result is made (the runners in
``running``, a draft's edits in ``services.drafts``) and where it is read (the pages, the API,
the exports, the evaluation). Pure: no ORM.

``Job.result_data`` holds ``to_json()`` of one of these; ``from_json`` reads it back, giving the
default for a key an older row does not have (a clause's ``end_page`` and a statement's or a
sentence's ``missing_facts`` came later). ``to_json`` writes the keys the rows have always had,
optional ones only when the runner wrote them, so that rows written before these types and rows
written after read alike, and the API serves the same keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from inference.clauses import DEFAULT_TAXONOMY, Clause
from inference.drafting import SentenceCheck
from inference.prompts import NumberedPassage, passage_source
from inference.sourcing import Statement

# --- summaries -------------------------------------------------------------------------------


def statement_to_json(statement: Statement) -> dict[str, Any]:
    return {**asdict(statement), "missing_facts": list(statement.missing_facts)}


def statement_from_json(data: Mapping[str, Any]) -> Statement:
    page, similarity = data.get("page"), data.get("similarity")
    return Statement(
        text=str(data["text"]),
        page=None if page is None else int(page),
        similarity=None if similarity is None else float(similarity),
        source=str(data.get("source", "none")),
        missing_facts=tuple(str(f) for f in _sequence(data.get("missing_facts"))),
    )


@dataclass(frozen=True)
class Partial:
    """A long document's section summary: the pages it read ("pages 3-5") and what it wrote."""

    pages: str
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"pages": self.pages, "text": self.text}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Partial:
        return cls(pages=str(data["pages"]), text=str(data["text"]))


@dataclass(frozen=True)
class SummaryResult:
    sections: tuple[str, ...] = ()  # the page label of each section the document was cut into
    partials: tuple[Partial, ...] | None = None  # None: one section, no partial summaries
    # Where each statement comes from; None with ``sourced``: the document's passages are embedded
    # by another model than the one loaded. Without ``sourced`` the row has no "statements" (the
    # summary is empty).
    statements: tuple[Statement, ...] | None = None
    sourced: bool = False
    resumed_parts: int = 0  # parts kept from an earlier attempt

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"sections": list(self.sections)}
        if self.partials is not None:
            data["partials"] = [p.to_json() for p in self.partials]
        if self.resumed_parts:
            data["resumed_parts"] = self.resumed_parts
        if self.sourced:
            data["statements"] = None if self.statements is None else [statement_to_json(s) for s in self.statements]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SummaryResult:
        partials, statements = data.get("partials"), data.get("statements")
        return cls(
            sections=tuple(str(s) for s in _sequence(data.get("sections"))),
            partials=None if partials is None else tuple(Partial.from_json(p) for p in partials),
            statements=None if statements is None else tuple(statement_from_json(s) for s in statements),
            sourced="statements" in data,
            resumed_parts=int(data.get("resumed_parts", 0)),
        )


# --- clauses ---------------------------------------------------------------------------------


def clause_to_json(clause: Clause) -> dict[str, Any]:
    return asdict(clause)


def clause_from_json(data: Mapping[str, Any]) -> Clause:
    page = int(data["page"])
    return Clause(
        category=str(data["category"]),
        quote=str(data["quote"]),
        page=page,
        start=int(data["start"]),
        end=int(data["end"]),
        note=str(data.get("note", "")),
        match=str(data.get("match", "exact")),
        end_page=int(data.get("end_page") or page),  # kept before quotes could cross a page break
    )


@dataclass(frozen=True)
class DroppedQuote:
    """A quote the model gave that the document does not contain (``clauses.verify_clauses``)."""

    category: str
    quote: str
    page: int

    def to_json(self) -> dict[str, Any]:
        return {"category": self.category, "quote": self.quote, "page": self.page}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DroppedQuote:
        return cls(category=str(data["category"]), quote=str(data["quote"]), page=int(data.get("page", 0)))


@dataclass(frozen=True)
class ClauseResult:
    taxonomy: str = DEFAULT_TAXONOMY
    categories: tuple[str, ...] = ()
    clauses: tuple[Clause, ...] = ()  # verified: each quote is the page's own text
    proposed: int = 0  # quotes the model gave
    dropped: int = 0  # of them, not found in the document
    dropped_examples: tuple[DroppedQuote, ...] = ()  # the first of those
    sections: int = 0
    incomplete_sections: int = 0  # sections whose answer ran past its token limit
    resumed_parts: int = 0

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "taxonomy": self.taxonomy,
            "categories": list(self.categories),
            "clauses": [clause_to_json(c) for c in self.clauses],
            "proposed": self.proposed,
            "dropped": self.dropped,
            "dropped_examples": [d.to_json() for d in self.dropped_examples],
            "sections": self.sections,
            "incomplete_sections": self.incomplete_sections,
        }
        if self.resumed_parts:
            data["resumed_parts"] = self.resumed_parts
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClauseResult:
        return cls(
            taxonomy=str(data.get("taxonomy", DEFAULT_TAXONOMY)),
            categories=tuple(str(c) for c in _sequence(data.get("categories"))),
            clauses=tuple(clause_from_json(c) for c in _sequence(data.get("clauses"))),
            proposed=int(data.get("proposed", 0)),
            dropped=int(data.get("dropped", 0)),
            dropped_examples=tuple(DroppedQuote.from_json(d) for d in _sequence(data.get("dropped_examples"))),
            sections=int(data.get("sections", 0)),
            incomplete_sections=int(data.get("incomplete_sections", 0)),
            resumed_parts=int(data.get("resumed_parts", 0)),
        )


# --- drafts ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassageRecord:
    """What a draft keeps of a passage it was given (``grounding.passage_record``): enough to
    link it, show it and check an edit against it again."""

    number: int  # as the draft cites it: [1]
    document_id: int
    document_title: str
    text: str
    chunk_id: int = 0
    page_start: int = 0
    page_end: int = 0
    char_start: int = 0
    char_end: int = 0

    @property
    def source(self) -> str:
        """ "Lease, p. 3"."""
        return passage_source(self.document_title, self.page_start, self.page_end)

    def numbered(self) -> NumberedPassage:
        return NumberedPassage(self.number, self.source, self.text)

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "chunk_id": self.chunk_id,
            "document_id": self.document_id,
            "document_title": self.document_title,
            "page_start": self.page_start,
            "page_end": self.page_end,
            "text": self.text,
            "char_start": self.char_start,
            "char_end": self.char_end,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PassageRecord:
        return cls(
            number=int(data["number"]),
            document_id=int(data["document_id"]),
            document_title=str(data.get("document_title", "")),
            text=str(data.get("text", "")),
            chunk_id=int(data.get("chunk_id", 0)),
            page_start=int(data.get("page_start", 0)),
            page_end=int(data.get("page_end", 0)),
            char_start=int(data.get("char_start", 0)),
            char_end=int(data.get("char_end", 0)),
        )


def sentence_to_json(check: SentenceCheck) -> dict[str, Any]:
    return asdict(check)


def sentence_from_json(data: Mapping[str, Any]) -> SentenceCheck:
    similarity = data.get("similarity")
    return SentenceCheck(
        text=str(data["text"]),
        citations=[int(n) for n in _sequence(data.get("citations"))],
        unknown_citations=[int(n) for n in _sequence(data.get("unknown_citations"))],
        similarity=None if similarity is None else float(similarity),
        supported=bool(data.get("supported", False)),
        missing_facts=[str(f) for f in _sequence(data.get("missing_facts"))],
    )


@dataclass(frozen=True)
class Support:
    """How many of a draft's sentences what they cite supports (``drafting.support_summary``),
    or ``error``: the check of an edit could not be made."""

    sentences: int = 0
    supported: int = 0
    unsupported: int = 0
    uncited: int = 0
    unknown_citations: tuple[int, ...] = ()
    error: bool = False

    def to_json(self) -> dict[str, Any]:
        if self.error:
            return {"error": True}
        return {
            "sentences": self.sentences,
            "supported": self.supported,
            "unsupported": self.unsupported,
            "uncited": self.uncited,
            "unknown_citations": list(self.unknown_citations),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Support:
        if data.get("error"):
            return cls(error=True)
        return cls(
            sentences=int(data.get("sentences", 0)),
            supported=int(data.get("supported", 0)),
            unsupported=int(data.get("unsupported", 0)),
            uncited=int(data.get("uncited", 0)),
            unknown_citations=tuple(int(n) for n in _sequence(data.get("unknown_citations"))),
        )


@dataclass(frozen=True)
class DraftResult:
    message: str = ""  # the message replied to
    scope: str = ""  # the documents searched, as a person reads it
    passages: tuple[PassageRecord, ...] = ()
    sentences: tuple[SentenceCheck, ...] = ()  # the model's draft, checked
    support: Support | None = None
    # The author's edit (``services.drafts.draft_edit``), and its check once a worker has made it
    # (None until then). A row without ``edited_text`` has none of these keys.
    edited_text: str | None = None
    edited_at: str | None = None  # ISO 8601
    edit_version: int = 0
    edited_sentences: tuple[SentenceCheck, ...] | None = None
    edited_support: Support | None = None

    @property
    def current_sentences(self) -> tuple[SentenceCheck, ...] | None:
        """The sentences of the draft as it now is: the edit's (None while it is checked), else
        the model's."""
        return self.edited_sentences if self.edited_text else self.sentences

    @property
    def current_support(self) -> Support | None:
        return self.edited_support if self.edited_text else self.support

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "message": self.message,
            "scope": self.scope,
            "passages": [p.to_json() for p in self.passages],
            "sentences": [sentence_to_json(s) for s in self.sentences],
            "support": None if self.support is None else self.support.to_json(),
        }
        if self.edited_text is not None:
            data |= {
                "edited_text": self.edited_text,
                "edited_at": self.edited_at,
                "edit_version": self.edit_version,
                "edited_sentences": (
                    None if self.edited_sentences is None else [sentence_to_json(s) for s in self.edited_sentences]
                ),
                "edited_support": None if self.edited_support is None else self.edited_support.to_json(),
            }
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DraftResult:
        support, edited_text = data.get("support"), data.get("edited_text")
        edited_sentences, edited_support = data.get("edited_sentences"), data.get("edited_support")
        edited_at = data.get("edited_at")
        return cls(
            message=str(data.get("message", "")),
            scope=str(data.get("scope", "")),
            passages=tuple(PassageRecord.from_json(p) for p in _sequence(data.get("passages"))),
            sentences=tuple(sentence_from_json(s) for s in _sequence(data.get("sentences"))),
            support=None if support is None else Support.from_json(support),
            edited_text=None if edited_text is None else str(edited_text),
            edited_at=None if edited_at is None else str(edited_at),
            edit_version=int(data.get("edit_version", 0)),
            edited_sentences=(
                None if edited_sentences is None else tuple(sentence_from_json(s) for s in edited_sentences)
            ),
            edited_support=None if edited_support is None else Support.from_json(edited_support),
        )


# --- chat, and any kind ----------------------------------------------------------------------


@dataclass(frozen=True)
class ChatResult:
    """A chat completion keeps its text, and why the engine ended it (``finish_reason``: "stop"
    or "length"; empty in rows written before it was kept, whose data is empty)."""

    finish_reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"finish_reason": self.finish_reason} if self.finish_reason else {}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ChatResult:
        return cls(finish_reason=str(data.get("finish_reason") or ""))


JobResult = SummaryResult | ClauseResult | DraftResult | ChatResult

RESULT_TYPES: dict[str, type[SummaryResult] | type[ClauseResult] | type[DraftResult] | type[ChatResult]] = {
    "summarise": SummaryResult,
    "extract_clauses": ClauseResult,
    "draft": DraftResult,
    "chat": ChatResult,
}


def result_for(kind: str, data: Mapping[str, Any] | None) -> JobResult:
    """The result of a job of ``kind`` (``JobKind``'s value) from its row's ``result_data``."""
    return RESULT_TYPES[kind].from_json(data or {})


def _sequence(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list | tuple) else ()
