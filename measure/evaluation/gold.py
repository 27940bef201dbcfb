"""The gold evaluation set: documents written for this project (CC0 1.0) and what a good answer
about them must contain: the clauses an extraction must find, the key facts a summary must state
and the passages a drafted reply must cite. ``data/README.md`` describes the files.

Pure: files in, dataclasses out, no ORM. Page numbers are those of the project's real text
extraction (``documents.extraction``), so they line up with what ingestion stores. Every
inconsistency in the data (an unknown document or category, a page out of range, a quote that is
not on its page) is a ``ValueError`` naming the file and the case.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from documents.extraction import KIND_TEXT, ExtractionError, extract_pages
from inference.clauses import CUAD_CATEGORIES, OFFICE_CATEGORIES

GOLD_DIR = Path(__file__).parent / "data"

LICENCE = "CC0-1.0"
CATEGORIES = CUAD_CATEGORIES + OFFICE_CATEGORIES
TONES = ("formal", "friendly", "firm")
LENGTHS = ("short", "standard")
MAX_REPLY_DOCUMENTS = 3


@dataclass(frozen=True)
class GoldDocument:
    key: str
    title: str  # the first line of the file
    filename: str  # "<key>.txt"
    data: bytes  # the file's bytes, to upload through the real ingestion
    pages: tuple[str, ...]  # page texts as the ingestion pipeline stores them; page 1 is pages[0]


@dataclass(frozen=True)
class GoldClause:
    category: str
    page: int
    quote: str  # verbatim from that page's text


@dataclass(frozen=True)
class ClauseCase:
    document: str
    clauses: tuple[GoldClause, ...]


@dataclass(frozen=True)
class KeyFact:
    fact: str
    page: int
    terms: tuple[tuple[str, ...], ...]  # groups of alternatives; every group must be matched


@dataclass(frozen=True)
class SummaryCase:
    document: str
    facts: tuple[KeyFact, ...]


@dataclass(frozen=True)
class ExpectedPassage:
    document: str
    page: int
    snippet: str  # verbatim from that page's text


@dataclass(frozen=True)
class ReplyCase:
    key: str
    message: str
    tone: str
    length: str
    documents: tuple[str, ...]
    expected: tuple[ExpectedPassage, ...]
    # A prompt injection in one of the case's own documents (one the author may read): what a
    # draft that followed it would say. A draft must say none of it.
    injection_document: str | None = None
    injection_markers: tuple[str, ...] = ()


@dataclass(frozen=True)
class GoldSet:
    documents: dict[str, GoldDocument]
    clauses: tuple[ClauseCase, ...]
    summaries: tuple[SummaryCase, ...]
    replies: tuple[ReplyCase, ...]
    distractor: str  # a document stored under another user: no reply may cite it


def load_gold_set(directory: Path = GOLD_DIR) -> GoldSet:
    """The whole set, checked against the documents' extracted pages."""
    directory = Path(directory)
    documents = _load_documents(directory / "documents")
    clauses = _load_clauses(directory / "clauses.json", documents)
    summaries = _load_summaries(directory / "summaries.json", documents)
    replies, distractor = _load_replies(directory / "replies.json", documents)
    return GoldSet(documents=documents, clauses=clauses, summaries=summaries, replies=replies, distractor=distractor)


# --- matching key facts --------------------------------------------------------------------------

_PUNCTUATION = str.maketrans(
    {
        "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'", "`": "'",
        "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
        "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2015": "-", "\u2212": "-",
    }
)  # fmt: skip
_WHITESPACE = re.compile(r"\s+")
_DIGIT_GROUP_SPACE = re.compile(r"(?<=\d) (?=\d{3}(?!\d))")  # "4 500" -> "4500"
_SPACE_BEFORE_PERCENT = re.compile(r"(?<=\d) (?=%)")  # "7.5 %" -> "7.5%"


def normalise_for_terms(text: str) -> str:
    """Case-folded text with quotes and dashes unified and whitespace collapsed. Digits and commas
    stay; a space (also a no-break or thin space) between digit groups is dropped ("4 500" ->
    "4500") and so is a space before a per cent sign ("7.5 %" -> "7.5%")."""
    return _normalise(text, join_digit_groups=True)


def _normalise(text: str, *, join_digit_groups: bool) -> str:
    text = unicodedata.normalize("NFKC", text).translate(_PUNCTUATION).casefold()
    text = _WHITESPACE.sub(" ", text).strip()
    if join_digit_groups:
        text = _DIGIT_GROUP_SPACE.sub("", text)
    return _SPACE_BEFORE_PERCENT.sub("", text)


def _readings(text: str) -> tuple[str, ...]:
    """The text normalised with digit groups joined, and without: "4 500" may be one number, but
    "£150 and £110" shortened to "150 110" is two."""
    joined = _normalise(text, join_digit_groups=True)
    separate = _normalise(text, join_digit_groups=False)
    return (joined,) if joined == separate else (joined, separate)


@functools.lru_cache(maxsize=4096)
def _term_pattern(term: str) -> re.Pattern[str] | None:
    """An alternative matches at the start of a word (so "consult" matches "consultation"); one
    ending in a digit must not run on into more digits ("4,500" is not in "14,500" or "4,500,000",
    "£10" is not in "£10.50")."""
    needle = normalise_for_terms(term)
    if not needle:
        return None
    tail = r"(?![\d]|[.,]\d)" if needle[-1].isdigit() else ""
    return re.compile(r"(?<!\w)" + re.escape(needle) + tail)


def _group_found(group: tuple[str, ...], readings: tuple[str, ...]) -> bool:
    patterns = [pattern for pattern in map(_term_pattern, group) if pattern is not None]
    return any(pattern.search(reading) for pattern in patterns for reading in readings)


def fact_covered(fact: KeyFact, summary: str) -> bool:
    """True when, for every group of the fact's terms, some alternative occurs in the summary
    (both normalised by ``normalise_for_terms``)."""
    readings = _readings(summary)
    return all(_group_found(group, readings) for group in fact.terms)


# --- loading and checking ------------------------------------------------------------------------


def _load_documents(folder: Path) -> dict[str, GoldDocument]:
    if not folder.is_dir():
        raise ValueError(f"{folder}: the documents folder is missing")
    documents = {}
    for path in sorted(folder.glob("*.txt")):
        data = path.read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"documents/{path.name}: not UTF-8 ({exc})") from exc
        title = text.split("\n", 1)[0].strip()
        if not title:
            raise ValueError(f"documents/{path.name}: the first line (the title) is empty")
        try:
            extracted = extract_pages(data, filename=path.name)
        except ExtractionError as exc:
            raise ValueError(f"documents/{path.name}: the extraction rejects it: {exc}") from exc
        if extracted.kind != KIND_TEXT:
            raise ValueError(f"documents/{path.name}: read as {extracted.kind!r}, not as plain text")
        pages = tuple(page.text for page in extracted.pages)
        for number, page in enumerate(pages, start=1):
            if not page.strip():
                raise ValueError(f"documents/{path.name}: page {number} is empty")
        documents[path.stem] = GoldDocument(key=path.stem, title=title, filename=path.name, data=data, pages=pages)
    if not documents:
        raise ValueError(f"{folder}: no documents (*.txt) found")
    return documents


def _read_json(path: Path) -> dict[str, Any]:
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ValueError(f"{path.name}: the file is missing") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path.name}: not valid UTF-8 JSON ({exc})") from exc
    if not isinstance(content, dict):
        raise ValueError(f"{path.name}: the top level must be an object")
    if content.get("licence") != LICENCE:
        raise ValueError(f"{path.name}: licence must be {LICENCE!r}, not {content.get('licence')!r}")
    if not isinstance(content.get("cases"), list) or not content["cases"]:
        raise ValueError(f"{path.name}: 'cases' must be a non-empty list")
    return content


_KIND_NAMES = {str: "a string", int: "an integer", list: "a list"}


def _field(item: Any, name: str, kind: type, where: str) -> Any:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected an object, not {type(item).__name__}")
    value = item.get(name)
    # bool is an int subclass; a page number of true is a mistake, not page 1.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{where}: {name!r} must be {_KIND_NAMES[kind]}, not {value!r}")
    if kind in (str, list) and not value:
        raise ValueError(f"{where}: {name!r} is empty")
    return value


def _document(documents: dict[str, GoldDocument], key: str, where: str) -> GoldDocument:
    if key not in documents:
        raise ValueError(f"{where}: unknown document {key!r} (no documents/{key}.txt)")
    return documents[key]


def _page(item: dict[str, Any], document: GoldDocument, where: str) -> int:
    page: int = _field(item, "page", int, where)
    if not 1 <= page <= len(document.pages):
        raise ValueError(f"{where}: page {page} is out of range; {document.key} has {len(document.pages)} page(s)")
    return page


def _check_verbatim(text: str, document: GoldDocument, page: int, where: str, what: str) -> None:
    if text in document.pages[page - 1]:
        return
    elsewhere = [number for number, page_text in enumerate(document.pages, start=1) if text in page_text]
    hint = f" (it is on page {elsewhere[0]})" if elsewhere else ""
    raise ValueError(f"{where}: {what} not found verbatim on page {page} of {document.key}{hint}: {text[:80]!r}")


def _unique_document(seen: set[str], key: str, where: str) -> None:
    if key in seen:
        raise ValueError(f"{where}: a second case for the same document")
    seen.add(key)


def _document_cases(
    path: Path, documents: dict[str, GoldDocument], items: str
) -> Iterator[tuple[str, GoldDocument, str, list[Any]]]:
    """Each case of a file of one case per document: its key, document, where (for errors) and
    the list under ``items``."""
    seen: set[str] = set()
    for index, raw_case in enumerate(_read_json(path)["cases"], start=1):
        key = _field(raw_case, "document", str, f"{path.name}, case {index}")
        where = f"{path.name}, case {key}"
        _unique_document(seen, key, where)
        yield key, _document(documents, key, where), where, _field(raw_case, items, list, where)


def _load_clauses(path: Path, documents: dict[str, GoldDocument]) -> tuple[ClauseCase, ...]:
    cases = []
    for key, document, where, items in _document_cases(path, documents, "clauses"):
        clauses = []
        for number, raw in enumerate(items, start=1):
            clause_where = f"{where}, clause {number}"
            category = _field(raw, "category", str, clause_where)
            if category not in CATEGORIES:
                raise ValueError(f"{clause_where}: unknown category {category!r}")
            clause_where = f"{clause_where} ({category})"
            page = _page(raw, document, clause_where)
            quote = _field(raw, "quote", str, clause_where)
            _check_verbatim(quote, document, page, clause_where, "quote")
            clauses.append(GoldClause(category=category, page=page, quote=quote))
        cases.append(ClauseCase(document=key, clauses=tuple(clauses)))
    return tuple(cases)


def _load_summaries(path: Path, documents: dict[str, GoldDocument]) -> tuple[SummaryCase, ...]:
    cases = []
    for key, document, where, items in _document_cases(path, documents, "facts"):
        facts = []
        for number, raw in enumerate(items, start=1):
            fact_where = f"{where}, fact {number}"
            fact = _field(raw, "fact", str, fact_where)
            page = _page(raw, document, fact_where)
            terms = _terms(_field(raw, "terms", list, fact_where), fact_where)
            # A term no alternative of which is on the page cannot be a fact the page states.
            page_readings = _readings(document.pages[page - 1])
            for group in terms:
                if not _group_found(group, page_readings):
                    raise ValueError(f"{fact_where}: no alternative of {list(group)} appears on page {page} of {key}")
            facts.append(KeyFact(fact=fact, page=page, terms=terms))
        cases.append(SummaryCase(document=key, facts=tuple(facts)))
    return tuple(cases)


def _terms(raw: list[Any], where: str) -> tuple[tuple[str, ...], ...]:
    groups = []
    for group in raw:
        if not isinstance(group, list) or not group:
            raise ValueError(f"{where}: each term group must be a non-empty list, not {group!r}")
        if not all(isinstance(term, str) and normalise_for_terms(term) for term in group):
            raise ValueError(f"{where}: term alternatives must be non-blank strings: {group!r}")
        groups.append(tuple(group))
    return tuple(groups)


def _load_replies(path: Path, documents: dict[str, GoldDocument]) -> tuple[tuple[ReplyCase, ...], str]:
    content = _read_json(path)
    distractor = _field(content, "distractor", str, path.name)
    _document(documents, distractor, f"{path.name}, distractor")
    cases = []
    seen: set[str] = set()
    for index, raw in enumerate(content["cases"], start=1):
        key = _field(raw, "key", str, f"{path.name}, case {index}")
        where = f"{path.name}, case {key}"
        if key in seen:
            raise ValueError(f"{where}: the key is used twice")
        seen.add(key)
        message = _field(raw, "message", str, where)
        tone = _field(raw, "tone", str, where)
        if tone not in TONES:
            raise ValueError(f"{where}: unknown tone {tone!r}; choose one of {', '.join(TONES)}")
        length = _field(raw, "length", str, where)
        if length not in LENGTHS:
            raise ValueError(f"{where}: unknown length {length!r}; choose one of {', '.join(LENGTHS)}")
        keys = _field(raw, "documents", list, where)
        if len(keys) > MAX_REPLY_DOCUMENTS or len(set(keys)) != len(keys):
            raise ValueError(f"{where}: 'documents' must name 1 to {MAX_REPLY_DOCUMENTS} different documents")
        for document_key in keys:
            if not isinstance(document_key, str):
                raise ValueError(f"{where}: document keys must be strings, not {document_key!r}")
            _document(documents, document_key, where)
            if document_key == distractor:
                raise ValueError(f"{where}: grounded on the distractor {distractor!r}, which no reply may cite")
        expected = []
        for number, passage in enumerate(_field(raw, "expected", list, where), start=1):
            passage_where = f"{where}, expected passage {number}"
            document_key = _field(passage, "document", str, passage_where)
            if document_key not in keys:
                raise ValueError(f"{passage_where}: document {document_key!r} is not among the case's documents")
            document = documents[document_key]
            page = _page(passage, document, passage_where)
            snippet = _field(passage, "snippet", str, passage_where)
            _check_verbatim(snippet, document, page, passage_where, "snippet")
            expected.append(ExpectedPassage(document=document_key, page=page, snippet=snippet))
        injection_document, markers = None, ()
        if "injection" in raw:
            injection = _field(raw, "injection", dict, where)
            injection_document = _field(injection, "document", str, f"{where}, injection")
            if injection_document not in keys:
                raise ValueError(f"{where}, injection: {injection_document!r} is not among the case's documents")
            markers = tuple(_field(injection, "markers", list, f"{where}, injection"))
            text = documents[injection_document].data.decode("utf-8")
            if not markers or not all(isinstance(m, str) and m and m in text for m in markers):
                raise ValueError(f"{where}, injection: each marker must be a string the document itself contains")
        cases.append(
            ReplyCase(
                key=key,
                message=message,
                tone=tone,
                length=length,
                documents=tuple(keys),
                expected=tuple(expected),
                injection_document=injection_document,
                injection_markers=markers,
            )
        )
    return tuple(cases), distractor
