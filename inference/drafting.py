"""Drafted replies grounded in the user's documents: the prompt, the citations and the check of
each sentence against what it cites. Pure: passages come in as arguments, embeddings through a
callable.

The model sees numbered passages (document title and page with each) as data, the incoming
message as data, and an instruction to cite passages as [n] after the sentences that use them
(``prompts.draft_messages``).
Afterwards every citation is resolved to its passage (a number that names no passage is
reported, never linked), and every sentence is checked against the passages it cites, by
embedding similarity and by its facts (``inference.facts``: numbers, dates, names, negations):
a sentence that cites nothing, is not close to what it cites, or states a fact its passages do
not, is flagged for the person who sends the reply.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from inference.facts import missing_facts
from inference.prompts import NumberedPassage
from inference.quotes import ABBREVIATIONS

SUPPORT_MIN_SIMILARITY = 0.5  # cosine similarity of a sentence to its best cited passage
DRAFT_MAX_TOKENS = {"short": 192, "standard": 384, "detailed": 768}  # per DRAFT_LENGTHS
DRAFT_PASSAGES = 6  # passages given to the model, best first
MESSAGE_MAX_CHARS = 12_000  # an incoming letter or e-mail; longer ones are cut, with a note
MAX_QUERIES = 10  # the whole message and up to nine of its points (asks, then paragraphs)
PARAGRAPH_QUERY_MIN_WORDS = 12  # a body paragraph, not "Dear Ms Vaughan," nor a signature
QUERY_MAX_CHARS = 1_000


_CITATION = re.compile(r"\[(\d{1,3}(?:\s*,\s*\d{1,3})*)\]")
# Abbreviations whose full stop ends no sentence: (p. 2), No. 5, Mr. Smith, e.g. this, Acme Inc.
# has, U.S. law: the quote candidates' list, as written, capitalised or in capitals.
_ABBREVIATIONS = sorted({form for a in ABBREVIATIONS for form in (a, a.capitalize(), a.upper())})
_NOT_AFTER = "".join(rf"(?<!\b{re.escape(a)}\.)" for a in _ABBREVIATIONS)
_SENTENCE_END = re.compile(rf"(?<=[.!?]){_NOT_AFTER}(?:\s*(?:\[\d{{1,3}}(?:\s*,\s*\d{{1,3}})*\]))*\s+(?=[A-Z0-9\"'(])")
# A line that starts a list item or a heading of its own: a bullet, "1." or "(a)", "#".
_ITEM = re.compile(r"^\s*(?:[-*\u2022\u25cf\u25aa\u2013]\s+|\d{1,3}[.)]\s+|\([a-z0-9ivx]{1,4}\)\s+|#{1,6}\s+)")


def _blocks(text: str) -> list[str]:
    """Paragraphs and list items: a blank line or a line that starts an item ends a block."""
    blocks: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if (not line.strip() or _ITEM.match(line)) and current:
            blocks.append(" ".join(current))
            current = []
        if line.strip():
            current.append(line.strip())
    if current:
        blocks.append(" ".join(current))
    return blocks


def strip_item_marker(sentence: str) -> str:
    """A list item's sentence without its bullet or number ("1." is not a fact it states)."""
    return _ITEM.sub("", sentence, count=1)


def split_sentences(text: str) -> list[str]:
    """Sentences of a reply or a summary, each keeping the citations that follow its full stop,
    and a list item its bullet; list items and paragraphs never run into each other."""
    sentences: list[str] = []
    for block in _blocks(text):
        start = 0
        marker = _ITEM.match(block)  # "1. Either party...": the item's number ends no sentence
        for match in _SENTENCE_END.finditer(block, marker.end() if marker else 0):
            end = match.start() + len(match.group(0).rstrip())
            sentence = block[start:end].strip()
            if sentence:
                sentences.append(sentence)
            start = end
        rest = block[start:].strip()
        if rest:
            sentences.append(rest)
    return sentences


def cited_numbers(sentence: str) -> list[int]:
    numbers: list[int] = []
    for group in _CITATION.findall(sentence):
        for part in group.split(","):
            number = int(part.strip())
            if number not in numbers:
                numbers.append(number)
    return numbers


def strip_citations(sentence: str) -> str:
    """The sentence's words alone: without its citations, or the bullet of a list item."""
    return strip_item_marker(_CITATION.sub("", sentence).strip()).strip()


@dataclass(frozen=True)
class SentenceCheck:
    text: str
    citations: list[int]  # numbers that name a passage
    unknown_citations: list[int]  # numbers that name none
    similarity: float | None  # to the best cited passage
    supported: bool
    # Facts of the sentence no cited passage states (``inference.facts``), as a person reads them:
    # a sentence close to its passage but with another number, date, name or negation.
    missing_facts: list[str] = field(default_factory=list)


class Vectors(Protocol):
    """One row of numbers per text, as an embedder gives them: a list of lists, or a numpy array."""

    def __len__(self) -> int: ...
    def __getitem__(self, rows: slice, /) -> Vectors: ...
    def __iter__(self) -> Iterator[Sequence[float]]: ...


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return float(dot / norm) if norm else 0.0  # a plain float, even from numpy vectors


def check_support(
    text: str,
    passages: Sequence[NumberedPassage],
    *,
    embed: Callable[[list[str]], Vectors],
    min_similarity: float = SUPPORT_MIN_SIMILARITY,
) -> list[SentenceCheck]:
    """Each sentence of a draft, with what it cites and whether the cited passages support it.
    ``embed`` turns texts into vectors (the appliance's sentence-transformers model)."""
    by_number = {p.number: p for p in passages}
    sentences = split_sentences(text)
    if not sentences:
        return []
    vectors = embed([strip_citations(s) for s in sentences] + [p.text for p in passages])
    sentence_vectors, passage_vectors = vectors[: len(sentences)], vectors[len(sentences) :]
    passage_vector = {p.number: v for p, v in zip(passages, passage_vectors, strict=True)}
    checks = []
    for sentence, vector in zip(sentences, sentence_vectors, strict=True):
        numbers = cited_numbers(sentence)
        known = [n for n in numbers if n in by_number]
        unknown = [n for n in numbers if n not in by_number]
        similarity = max((_cosine(vector, passage_vector[n]) for n in known), default=None)
        missing = [f.describe() for f in missing_facts(strip_citations(sentence), [by_number[n].text for n in known])]
        supported = similarity is not None and similarity >= min_similarity and not missing
        checks.append(
            SentenceCheck(
                sentence, known, unknown, None if similarity is None else round(similarity, 3), supported, missing
            )
        )
    return checks


_WH = r"(?:how|what|when|whether|why|which|who|whom|where)"
# A sentence that asks without a question mark: "we would like to know whether ...", "please
# could you explain who ...", "let us know if ...". English only: a letter in another language
# has its questions (a question mark) and its paragraphs as points.
_INDIRECT_ASK = re.compile(
    rf"\b(?:know|confirm|explain|tell (?:me|us)|clarify|advise|ask|wonder(?:ing)?)(?:\s+\w+){{0,2}}?"
    rf"\s+(?:{_WH}|if)\b",
    re.IGNORECASE,
)
# Set phrases of courtesy that ask for nothing a document answers ("Please let me know if you
# have any questions."); only a sentence without a question mark is read as one.
_COURTESY = re.compile(
    r"\bif you (?:have|need|require) any(?:thing)?\b|\bif you (?:need|require) (?:any )?further\b"
    r"|\bif you would like\b|\b(?:do not|don't|don’t) hesitate\b|\blook(?:ing)? forward to\b"
    r"|\bhearing from you\b|\bgrateful for (?:your|a) (?:early |prompt |swift )?(?:reply|response)\b",
    re.IGNORECASE,
)
# A piece of a sentence that asks something itself, not the context before an ask ("if I did
# decide to resign, how much notice ...").
_ASKING = re.compile(
    rf"\b(?:could|would|can|will|may) (?:you|we|I)\b|\bplease\b|\b(?:know|confirm|explain|tell|clarify|advise)\b"
    rf"|\b{_WH}\b",
    re.IGNORECASE,
)
# Where one ask ends and the next of the same sentence begins, in a list of asks: "confirm on
# what date ..., how much notice ..., and whether ...". A bare comma splits only in a sentence
# that has such a list (an "and" or "or" before a question word), and never before a relative
# "who" or "which" ("our tenant, who moved in on 1 May, ..."); "whether A or whether B" asks
# one thing.
_NEXT_ASK = re.compile(rf"(?:,\s*(?:and\s+|or\s+)?|\s+(?:and|or)\s+)(?={_WH}\b)", re.IGNORECASE)
_CONJUNCTION = re.compile(r"\b(and|or)\b", re.IGNORECASE)
_RELATIVE = re.compile(r"(?:who|whom|which)\b", re.IGNORECASE)
ASK_MIN_WORDS = 4  # shorter pieces stay with the ask before them ("when, where and how?")
# Where a message stops being its sender's own words: a quoted thread or a forwarded one.
_THREAD = re.compile(r"^\s*(?:>|-{2,}\s*(?:Original|Forwarded) Message|On .{0,200}\bwrote:\s*$|From:\s)", re.IGNORECASE)
# Lines and blocks that are not the sender asking or telling anything: headers, disclaimers,
# contact details.
_HEADER = re.compile(r"^\s*(?:Subject|Re|Fwd?|Fw|To|Cc|Sent|Date):", re.IGNORECASE)
_DISCLAIMER = re.compile(r"^(?:this (?:e-?mail|message)|confidential|disclaimer)\b", re.IGNORECASE)
_CONTACT = re.compile(r"[\w.+-]+@[\w-]+\.\w|\|")  # an address or "Tel | Fax": a signature, not a paragraph


def _is_question(sentence: str) -> bool:
    return sentence.rstrip(")\"'”’»").endswith("?") and len(sentence) > 12


def _split_asks(sentence: str) -> list[str]:
    """A sentence that asks, cut where it goes on to ask something else (``_NEXT_ASK``)."""

    def joins(match: re.Match[str]) -> str | None:
        """The conjunction of a cut ("and", "or"), "" for a bare comma, None where it is no cut."""
        found = _CONJUNCTION.search(match.group(0))
        conjunction = found.group(1).lower() if found else ""
        after = sentence[match.end() :]
        if conjunction == "or" and after.lower().startswith("whether"):
            return None
        if not conjunction and _RELATIVE.match(after):
            return None
        return conjunction

    joints = [(match, joins(match)) for match in _NEXT_ASK.finditer(sentence)]
    cuts = [match for match, joint in joints if joint is not None]
    if not any(joint for _, joint in joints):
        return [sentence]  # commas alone make no list of asks
    # Cut where both sides have words of their own: "how, when and why the fees changed" is
    # one ask. The context before the first ask stays with it.
    bounds = [0, *(x for match in cuts for x in (match.start(), match.end())), len(sentence)]
    segments = [(bounds[i], bounds[i + 1]) for i in range(0, len(bounds), 2)]  # between the cuts
    pieces: list[str] = []
    start = 0
    for (a, b), (c, d) in zip(segments, segments[1:], strict=False):
        if (
            len(sentence[a:b].split()) >= ASK_MIN_WORDS
            and len(sentence[c:d].split()) >= ASK_MIN_WORDS
            and _ASKING.search(sentence[start:b])
        ):
            pieces.append(sentence[start:b].strip())
            start = c
    pieces.append(sentence[start:].strip())
    return [piece for piece in pieces if piece]


def _asks(sentence: str) -> list[str]:
    """The separate things one sentence asks, or none when it asks nothing. A question mark
    ends an ask even where no capital letter follows ("what's the notice? also can we ...")."""
    asks: list[str] = []
    for part in re.split(r"(?<=\?)\s+", strip_item_marker(sentence.strip())):
        question = _is_question(part)
        if not question and (_COURTESY.search(part) or not _INDIRECT_ASK.search(part)):
            continue
        asks += _split_asks(part)
    return asks


def _own_words(message: str) -> str:
    """The message down to where a quoted or forwarded thread starts (all of it if it starts
    with one), without header lines."""
    lines = message.splitlines()
    for n, line in enumerate(lines):
        if n and _THREAD.match(line):
            lines = lines[:n]
            break
    return "\n".join(line for line in lines if not _HEADER.match(line))


def message_points(message: str) -> list[str]:
    """What a reply to ``message`` has to answer: first each thing it asks, in the message's
    order (a question, or a sentence that asks without a question mark, cut where it goes on to
    ask something else: "how quickly ..., how long ..., and what ..."; each item of a list that
    follows an ask ending in a colon), then each body paragraph that asks nothing (a request
    written as a statement, "we would ask that the audit is postponed", or the facts the reply
    must answer). Greetings, sign-offs, courtesies, headers, contact details and a quoted
    thread are not points."""
    asks: list[str] = []
    paragraphs: list[str] = []
    listing = False  # the items after "Could you please confirm:" are its asks
    for block in _blocks(_own_words(message)):
        block = " ".join(block.split())
        item = _ITEM.match(block) is not None
        if listing and item:
            text = strip_item_marker(block)
            if len(text.split()) >= 2:
                asks.append(text)
            continue
        listing = False
        if _DISCLAIMER.match(block):
            continue
        sentences = split_sentences(block)
        if block.endswith(":") and _ASKING.search(sentences[-1]):
            listing = True  # its last sentence introduces the list, and asks nothing by itself
            sentences = sentences[:-1]
        found = [ask for sentence in sentences for ask in _asks(sentence)]
        if found:
            asks += found
        elif (
            not listing
            and len(block.split()) >= PARAGRAPH_QUERY_MIN_WORDS
            and not (len(sentences) == 1 and _COURTESY.search(block))
            and not _CONTACT.search(block)
        ):
            paragraphs.append(strip_item_marker(block))
    return list(dict.fromkeys(point[:QUERY_MAX_CHARS] for point in asks + paragraphs))


def retrieval_queries(message: str) -> list[str]:
    """What to search for to answer ``message``: the message itself (its start, as the embedder
    reads only so much), then each of its points (``message_points``): each thing it asks,
    then each body paragraph that asks nothing. A letter with three questions finds passages for
    all three and not only for the one its wording leans on, and a request written as a
    statement in its third paragraph is searched for too. Searching also each question and
    paragraph as written, beside the points, diluted the fusion (reply gold set recall@6 0.656
    and 0.688, against 0.781 with the points alone and 0.750 with questions and paragraphs as
    written, no points)."""
    text = " ".join(message.split())
    if not text:
        return []
    return list(dict.fromkeys([text[:QUERY_MAX_CHARS], *message_points(message)]))[:MAX_QUERIES]


def fuse_rankings(rankings: Sequence[Sequence[int]], *, k: int = 60) -> list[int]:
    """Reciprocal-rank fusion of several ranked lists of ids, best first (ties: first seen)."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores, key=lambda item: -scores[item])


def fuse_by_passage_and_document(
    rankings: Sequence[Sequence[int]],
    document_of: Mapping[int, int],
    *,
    k: int = 60,
    per_document: int = DRAFT_PASSAGES,
) -> list[int]:
    """Passages ranked for a whole message: the queries' rankings fused by reciprocal rank
    (``fuse_rankings``), and that order fused once more with a second one that takes the best
    ``per_document`` passages of each document together, documents in the order of their best
    passage, then every other passage in the first order. A letter is about one or two
    documents: the passages that answer its several questions are in the documents its best
    passages are in, and a passage of an unrelated document that happens to match one
    paragraph's wording well gives way to them. Documents go by their best passage, not by the
    sum of their passages' scores: a sum favours a long document, or one that matches every
    query a little, over a one-page notice whose passage is first for every query (on the reply
    gold set such a passage was sixth, and recall@6 was 0.812 with sums against 0.844 by the
    best passage). Only a document's best six are taken together (as many as a draft is given),
    so a long document's many weak candidates do not bury a second document's best passage. With
    one document searched, the second order is the first and nothing changes. No weight is
    fitted: both orders count alike. An id with no document is a document of its own."""
    by_passage = fuse_rankings(rankings, k=k)
    best: dict[object, list[int]] = {}  # documents in the order their best passage comes in
    for item in by_passage:
        kept = best.setdefault(document_of.get(item, ("passage", item)), [])
        if len(kept) < per_document:
            kept.append(item)
    leading = [item for items in best.values() for item in items]
    taken = set(leading)
    by_document = leading + [item for item in by_passage if item not in taken]
    return fuse_rankings([by_passage, by_document], k=k)


def sentence_parts(sentence: str) -> list[tuple[str, str | int]]:
    """A sentence as ("text", str) and ("cite", number) pieces, for linking each citation."""
    parts: list[tuple[str, str | int]] = []
    position = 0
    for match in _CITATION.finditer(sentence):
        if match.start() > position:
            parts.append(("text", sentence[position : match.start()]))
        for number in cited_numbers(match.group(0)):
            parts.append(("cite", number))
        position = match.end()
    if position < len(sentence):
        parts.append(("text", sentence[position:]))
    return parts


def support_summary(checks: Sequence[SentenceCheck]) -> dict[str, Any]:
    """Counts for the job's note and the API."""
    return {
        "sentences": len(checks),
        "supported": sum(check.supported for check in checks),
        "unsupported": sum(not check.supported for check in checks),
        "uncited": sum(not check.citations for check in checks),
        "unknown_citations": sorted({n for check in checks for n in check.unknown_citations}),
    }
