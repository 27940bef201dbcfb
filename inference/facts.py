"""The facts of a sentence, and which of them a passage does not state. Pure.

Embedding similarity says a sentence is *about* what a passage says; it cannot see that "three
months" is not "six months", that "Beta" is not "Acme", or that a "not" went missing: those
sentences are as close to the passage as the right one. So a sentence that cites a passage (a
draft's sentence, a summary's statement) is also held to the passage's facts:

- every number (digits or words, "thirty (30)" is one number; "1,000" is 1000), and each number
  with its unit ("30 days", "5 %", "$2,000");
- every date and month ("June 1, 2000", "1 June 2000", "2000-06-01", "06/01/2000");
- every name or defined term written with capitals in the middle of the sentence ("Acme",
  "the Supplier", "Confidential Information"), and any term in quotes;
- every negation, by what it negates: a "not" before "disclose" in the passage needs a negation
  before "disclose" in the sentence, and the other way round.

A fact of the sentence that none of its cited passages states is reported with what it is, so a
person reading the draft sees why it was flagged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NUMBER_WORDS = {
    "zero": 0,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
    "hundred": 100,
    "thousand": 1000,
    "million": 1_000_000,
    "billion": 1_000_000_000,
    "half": 0.5,
    "twice": 2,
    "double": 2,
}  # fmt: skip  (ordinals are left out: "a third party" states no number)
_MONTHS = {
    "january": 1, "february": 2, "march": 3, "april": 4, "may": 5, "june": 6, "july": 7,
    "august": 8, "september": 9, "october": 10, "november": 11, "december": 12,
    "jan": 1, "feb": 2, "mar": 3, "apr": 4, "jun": 6, "jul": 7, "aug": 8, "sep": 9, "sept": 9,
    "oct": 10, "nov": 11, "dec": 12,
}  # fmt: skip
_UNITS = {
    "day": "day", "days": "day", "business": "business day", "week": "week", "weeks": "week",
    "month": "month", "months": "month", "year": "year", "years": "year", "hour": "hour",
    "hours": "hour", "minute": "minute", "minutes": "minute", "%": "percent", "percent": "percent",
    "per": "percent", "pounds": "money", "dollars": "money", "euros": "money", "usd": "money",
    "gbp": "money", "eur": "money", "$": "money", "\u00a3": "money", "\u20ac": "money",
    "times": "times", "copies": "copies", "days'": "day", "months'": "month", "years'": "year",
}  # fmt: skip
_NEGATIONS = frozenset(
    [
        "not",
        "no",
        "never",
        "neither",
        "nor",
        "none",
        "nothing",
        "nobody",
        "without",
        "cannot",
        "can't",
        "won't",
        "shan't",
        "don't",
        "doesn't",
        "didn't",
        "isn't",
        "aren't",
        "wasn't",
        "weren't",
        "shouldn't",
        "wouldn't",
        "mustn't",
        "couldn't",
    ]
)
# Words written with a capital that are not names: the start of a sentence aside, these are
# capitalised in letters for other reasons.
_NOT_NAMES = frozenset(
    [
        "i",
        "dear",
        "yours",
        "sincerely",
        "regards",
        "kind",
        "best",
        "thank",
        "thanks",
        "please",
        "the",
        "a",
        "an",
        "this",
        "that",
        "these",
        "those",
        "our",
        "your",
        "my",
        "we",
        "you",
        "he",
        "she",
        "they",
        "it",
        "if",
        "in",
        "on",
        "at",
        "for",
        "as",
        "and",
        "or",
        "but",
        "to",
        "of",
        "by",
        "with",
        "from",
        "under",
        "per",
        "re",
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
        "sunday",
        "mr",
        "mrs",
        "ms",
        "dr",
    ]
)
_TOKEN = re.compile(
    r"[$\u00a3\u20ac]?\d[\d,]*(?:\.\d+)?%?|[A-Za-z][A-Za-z'\u2019\-]*|[$\u00a3\u20ac%]"
)  # fmt: skip
_QUOTED = re.compile(r"[\"\u201c]([^\"\u201d]{2,60})[\"\u201d]")
_ISO_DATE = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")
_SLASH_DATE = re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{2,4})\b")
_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "to",
        "in",
        "on",
        "at",
        "for",
        "by",
        "with",
        "from",
        "and",
        "or",
        "as",
        "is",
        "are",
        "be",
        "been",
        "being",
        "shall",
        "will",
        "may",
        "must",
        "would",
        "should",
        "can",
        "could",
        "this",
        "that",
        "these",
        "those",
        "it",
        "its",
        "their",
        "his",
        "her",
        "our",
        "your",
        "any",
        "all",
        "each",
        "such",
        "which",
        "who",
        "whom",
        "whose",
        "than",
        "then",
        "there",
        "here",
        "so",
        "also",
        "only",
        "other",
        "within",
        "upon",
        "into",
        "under",
        "over",
        "after",
        "before",
    ]
)
NEGATION_REACH = 4  # content words after a negation that it is taken to negate


@dataclass(frozen=True)
class Fact:
    kind: str  # "number", "quantity", "date", "month", "name", "negation"
    value: str  # canonical, for comparing
    text: str  # as the sentence wrote it, for the person reading

    def describe(self) -> str:
        if self.kind == "negation":
            return f"the negation \u201c{self.text}\u201d"
        if self.kind == "dropped_negation":
            return f"the passage says \u201cnot\u201d before \u201c{self.text}\u201d"
        return f"{self.kind} \u201c{self.text}\u201d"


def _canonical_number(token: str) -> str | None:
    digits = token.strip("$\u00a3\u20ac%").replace(",", "")
    try:
        value = float(digits)
    except ValueError:
        return None
    return f"{value:g}" if value != int(value) else str(int(value))


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.replace("\u2019", "'"))


def _numbers(tokens: list[str]) -> list[tuple[str, int]]:
    """(canonical value, index of the token that ends it) of every number in the text;
    "thirty (30)" gives 30 once (at the digits); "five thousand" is 5000."""
    found: list[tuple[str, int]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i].lower()
        if token[:1].isdigit() or token[:1] in "$\u00a3\u20ac" and token[1:2].isdigit():
            value = _canonical_number(token)
            if value is not None:
                found.append((value, i))
            i += 1
            continue
        if token in _NUMBER_WORDS:
            amount, j = float(_NUMBER_WORDS[token]), i + 1
            while j < len(tokens) and tokens[j].lower() in _NUMBER_WORDS:
                nxt = _NUMBER_WORDS[tokens[j].lower()]
                amount = amount * nxt if nxt >= 100 else amount + nxt
                j += 1
            if j < len(tokens) and _canonical_number(tokens[j]) == f"{amount:g}":
                i = j  # "thirty (30)": the digits follow, counted there
                continue
            found.append((f"{amount:g}", j - 1))
            i = j
            continue
        i += 1
    return found


def _unit_after(tokens: list[str], index: int) -> str | None:
    token = tokens[index]
    if token.endswith("%"):
        return "percent"
    if token[:1] in "$\u00a3\u20ac":
        return "money"
    for ahead in tokens[index + 1 : index + 3]:
        unit = _UNITS.get(ahead.lower())
        if unit:
            return unit
        if ahead.lower() not in ("calendar", "working", "consecutive", "full", "(", ")"):
            break
    before = tokens[index - 1].lower() if index > 0 else ""
    return "money" if before in ("$", "\u00a3", "\u20ac", "usd", "gbp", "eur") else None


def _dates(text: str) -> list[Fact]:
    facts = []
    for year, month, day in _ISO_DATE.findall(text):
        facts.append(Fact("date", f"{int(year)}-{int(month)}-{int(day)}", f"{year}-{month}-{day}"))
    for first, second, year in _SLASH_DATE.findall(text):
        year_n = int(year) + (2000 if len(year) == 2 and int(year) < 50 else 1900 if len(year) == 2 else 0)
        facts.append(Fact("date", f"{year_n}-{int(first)}-{int(second)}", f"{first}/{second}/{year}"))
    return facts


def _names(text: str) -> list[Fact]:
    """Capitalised words and runs of them not at a sentence's start, and quoted terms."""
    facts = [Fact("name", " ".join(q.lower().split()), q) for q in _QUOTED.findall(text)]
    words = list(re.finditer(r"[A-Za-z][A-Za-z'\u2019\-]*", text))
    run: list[str] = []

    def close() -> None:
        if run:
            facts.append(Fact("name", " ".join(run).lower(), " ".join(run)))
            run.clear()

    def name_like(word: str) -> bool:
        lower = word.lower()
        return (
            word[0].isupper()
            and lower not in _NOT_NAMES
            and lower not in _STOPWORDS
            and lower not in _MONTHS
            and lower not in _NUMBER_WORDS
            and not (word.isupper() and len(word) > 1 and text.isupper())
        )

    for index, match in enumerate(words):
        word = match.group(0)
        before = text[: match.start()].rstrip()
        sentence_start = index == 0 or before[-1:] in '.!?:;"\u201c(' or before.endswith("\n")
        # A capital at a sentence's start says nothing, unless a name goes on ("Beta Ltd").
        following = words[index + 1].group(0) if index + 1 < len(words) else ""
        if name_like(word) and (not sentence_start or (following and name_like(following))) or run and name_like(word):
            run.append(word)
        else:
            close()
    close()
    return facts


def _content(tokens: list[str]) -> list[tuple[str, int]]:
    return [(t.lower(), i) for i, t in enumerate(tokens) if t.lower() not in _STOPWORDS and t[:1].isalpha()]


def _negated_words(tokens: list[str], reach: int) -> set[str]:
    """The content words a negation of the text reaches (the ``reach`` after it)."""
    negated: set[str] = set()
    content = _content(tokens)
    for i, token in enumerate(tokens):
        if token.lower() in _NEGATIONS or token.lower().endswith("n't"):
            after = [w for w, j in content if j > i and w not in _NEGATIONS][:reach]
            negated.update(_stem(w) for w in after)
    return negated


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def facts_of(text: str) -> list[Fact]:
    """The checkable facts of a sentence (numbers, quantities, dates, months, names)."""
    tokens = _tokens(text)
    facts: list[Fact] = []
    for value, index in _numbers(tokens):
        facts.append(Fact("number", value, tokens[index]))
        unit = _unit_after(tokens, index)
        if unit:
            facts.append(Fact("quantity", f"{value} {unit}", f"{tokens[index]} {unit}"))
    facts += _dates(text)
    facts += [Fact("month", str(_MONTHS[t.lower()]), t) for t in tokens if t.lower() in _MONTHS and t[0].isupper()]
    facts += _names(text)
    return facts


def missing_facts(sentence: str, passages: list[str]) -> list[Fact]:
    """The facts of ``sentence`` that none of ``passages`` states, and negations that do not
    agree: the sentence negates words the passages state plainly, or states plainly words a
    passage negates. Empty: nothing the sentence claims contradicts what it cites."""
    if not passages:
        return []
    stated = {(f.kind, f.value) for p in passages for f in facts_of(p)}
    passage_text = " ".join(" ".join(p.split()) for p in passages).lower()
    missing: list[Fact] = []
    seen: set[tuple[str, str]] = set()
    for fact in facts_of(sentence):
        key = (fact.kind, fact.value)
        if key in seen:
            continue
        seen.add(key)
        if key in stated:
            continue
        if fact.kind == "name" and fact.value in passage_text:
            continue  # written in lower case or within a longer name there
        missing.append(fact)
    # Negations, by the words they reach: the sentence negates a word the passages use and
    # never negate; or it uses plainly the word right after a negation of the passages (the
    # verb of "shall not disclose") that they never use plainly.
    sentence_tokens = _tokens(sentence)
    mine = _negated_words(sentence_tokens, NEGATION_REACH)
    words_here = {_stem(w) for w, _ in _content(sentence_tokens)}
    theirs: set[str] = set()
    theirs_first: set[str] = set()
    plain_uses: set[str] = set()  # words a passage uses outside a negation's reach
    used: set[str] = set()
    for passage in passages:
        tokens = _tokens(passage)
        negated = _negated_words(tokens, NEGATION_REACH)
        theirs |= negated
        theirs_first |= _negated_words(tokens, 1)
        words = {_stem(w) for w, _ in _content(tokens)}
        used |= words
        plain_uses |= words - negated
    added = sorted(w for w in mine if w in used and w not in theirs)
    if added:
        missing.append(Fact("negation", "+" + added[0], _negation_text(sentence_tokens)))
    dropped = sorted(w for w in theirs_first if w in words_here and w not in mine and w not in plain_uses)
    if dropped:
        missing.append(Fact("dropped_negation", "-" + dropped[0], dropped[0]))
    return missing


def _negation_text(tokens: list[str]) -> str:
    for i, token in enumerate(tokens):
        if token.lower() in _NEGATIONS or token.lower().endswith("n't"):
            return " ".join(tokens[i : i + 3])
    return ""
