"""Chunking: offsets, pages, overlap and limits, with a fake tokenizer and with the real one."""

from __future__ import annotations

import random
import re

import pytest

from documents.chunking import (
    DEFAULT_MAX_TOKENS,
    PAGE_SEPARATOR,
    ChunkSpan,
    chunk_pages,
    document_text,
    pages_with_offsets,
)


class FakeTokenizer:
    """A fake of the Hugging Face tokenizer interface: one token per run of non-whitespace."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=True):
        self.calls.append(text)
        return {"offset_mapping": [match.span() for match in re.finditer(r"\S+", text)]}


WORDS = (
    "invoice", "payment", "supplier", "customer", "notice", "termination", "liability", "confidential",
    "agreement", "services", "schedule", "fees", "delivery", "warranty", "breach", "remedy", "party", "clause",
    "period", "renewal", "audit", "records",
)  # fmt: skip


def _sentences(rng: random.Random, count: int) -> str:
    sentences = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
        sentences.append(" ".join(words).capitalize() + rng.choice([".", ".", ".", "?", ";"]))
    text = ""
    for sentence in sentences:
        text += sentence + rng.choice([" ", " ", " ", "\n", "\n\n"])
    return text.strip()


def _pages(seed: int = 7, count: int = 5) -> list:
    rng = random.Random(seed)
    return pages_with_offsets([_sentences(rng, rng.randint(5, 40)) for _ in range(count)])


def _assert_invariants(pages, spans: list[ChunkSpan], count_tokens, max_tokens: int) -> None:
    text = document_text(pages)
    assert spans, "a document with text has chunks"
    covered = bytearray(len(text))
    for position, span in enumerate(spans):
        assert span.index == position
        assert span.text.strip(), "no empty chunks"
        assert span.text == span.text.strip(), "chunks neither start nor end with whitespace"
        assert text[span.char_start : span.char_end] == span.text
        assert 0 < span.token_count <= max_tokens
        assert count_tokens(span.text) <= max_tokens
        assert span.page_start <= span.page_end
        for offset in range(span.char_start, span.char_end):
            covered[offset] = 1
    missing = [i for i, ch in enumerate(text) if not ch.isspace() and not covered[i]]
    assert missing == [], f"characters in no chunk at {missing[:10]}"
    for before, after in zip(spans, spans[1:], strict=False):
        assert after.char_start > before.char_start, "chunks advance"


def _page_of(pages, offset: int) -> int:
    return [number for number, start, _ in pages if start <= offset][-1]


def _fake_count(text: str) -> int:
    return len(text.split())


def test_offsets_pages_and_coverage_with_fake_tokenizer():
    pages = _pages()
    spans = chunk_pages(pages, FakeTokenizer(), max_tokens=50, overlap_tokens=10)
    _assert_invariants(pages, spans, _fake_count, 50)
    for span in spans:
        assert span.page_start == _page_of(pages, span.char_start)
        assert span.page_end == _page_of(pages, span.char_end - 1)
    assert any(span.page_start < span.page_end for span in spans), "this document has chunks across pages"
    assert spans[0].page_start == 1 and spans[-1].page_end == len(pages)


def test_each_page_is_tokenised_once():
    pages = _pages(count=6)
    tokenizer = FakeTokenizer()
    chunk_pages(pages, tokenizer, max_tokens=30, overlap_tokens=5)
    assert tokenizer.calls == [text for _, _, text in pages]


def test_consecutive_chunks_overlap():
    pages = pages_with_offsets([" ".join(f"w{i}" for i in range(1000))])  # no sentences: cuts by tokens only
    spans = chunk_pages(pages, FakeTokenizer(), max_tokens=100, overlap_tokens=20)
    for before, after in zip(spans, spans[1:], strict=False):
        shared = before.text.split()[-20:]
        assert after.text.split()[:20] == shared
    assert all(span.token_count == 100 for span in spans[:-1])
    assert spans[-1].text.endswith("w999")


def test_prefers_to_end_at_a_sentence_or_paragraph():
    sentence = "alpha beta gamma delta epsilon zeta eta theta iota kappa."  # 10 tokens
    paragraph = " ".join([sentence] * 3)
    pages = pages_with_offsets([PAGE_SEPARATOR.join([paragraph] * 4)])
    spans = chunk_pages(pages, FakeTokenizer(), max_tokens=35, overlap_tokens=5)
    text = document_text(pages)
    assert len(spans) == 4
    for span in spans:  # each ends where a paragraph does, not 5 tokens into the next one
        assert span.text.endswith("kappa.")
        assert text[span.char_end : span.char_end + 2] in (PAGE_SEPARATOR, "")
    assert spans[0].token_count == 30
    for before, after in zip(spans, spans[1:], strict=False):  # no sentence was cut: nothing repeated
        assert text[before.char_end : after.char_start] == PAGE_SEPARATOR


def test_a_cut_at_a_sentence_end_repeats_nothing_and_one_inside_a_sentence_overlaps():
    short = "alpha beta gamma delta epsilon zeta eta theta iota kappa."  # 10 tokens
    long = " ".join(f"w{i}" for i in range(60)) + "."  # one sentence longer than a chunk
    pages = pages_with_offsets([" ".join([short] * 4 + [long])])
    spans = chunk_pages(pages, FakeTokenizer(), max_tokens=35, overlap_tokens=5)
    text = document_text(pages)
    assert spans[0].text.endswith("kappa.") and spans[0].token_count == 30
    assert text[spans[0].char_end : spans[1].char_start] == " "  # the next sentence, nothing repeated
    inside = [(a, b) for a, b in zip(spans, spans[1:], strict=False) if not a.text.endswith(".")]
    assert inside  # the long sentence had to be cut
    for before, after in inside:
        assert after.text.split()[:5] == before.text.split()[-5:]


def test_small_and_degenerate_inputs():
    tokenizer = FakeTokenizer()
    assert chunk_pages([], tokenizer) == []
    assert chunk_pages(pages_with_offsets(["", "  \n "]), tokenizer) == []
    pages = pages_with_offsets(["", "One short page.", ""])
    (span,) = chunk_pages(pages, tokenizer)
    assert (span.page_start, span.page_end, span.text, span.token_count) == (2, 2, "One short page.", 3)
    assert document_text(pages)[span.char_start : span.char_end] == span.text
    # One word longer than a chunk is cut rather than looping or dropped.
    pages = pages_with_offsets(["a " * 5 + "b" * 30])
    spans = chunk_pages(pages, FakeTokenizer(), max_tokens=3, overlap_tokens=1)
    _assert_invariants(pages, spans, _fake_count, 3)


def test_rejects_wrong_page_offsets_and_settings():
    with pytest.raises(ValueError, match="page 2"):
        chunk_pages([(1, 0, "abc"), (2, 4, "def")], FakeTokenizer())
    with pytest.raises(ValueError):
        chunk_pages(_pages(), FakeTokenizer(), max_tokens=10, overlap_tokens=10)


# --- the real tokenizer of the embedding model --------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
    from documents.embeddings import get_embedder

    return get_embedder().tokenizer


def _real_count(tokenizer):
    return lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_real_tokenizer_limits_offsets_and_pages(tokenizer):
    pages = pages_with_offsets(
        [
            "SERVICES AGREEMENT\nThis agreement is made between Northwind Ltd (the Supplier) and Contoso plc.\n"
            + _sentences(random.Random(1), 30),
            "3. Fees. The Customer pays 4,800 pounds per month; reference XK-42-ZULU, naïve café façade.\n"
            + _sentences(random.Random(2), 45),
            "",  # a blank page
            "Unbreakable: " + "supercalifragilistic" * 40 + " end. " + _sentences(random.Random(3), 20),
        ]
    )
    spans = chunk_pages(pages, tokenizer)  # the defaults
    _assert_invariants(pages, spans, _real_count(tokenizer), DEFAULT_MAX_TOKENS)
    for span in spans:
        assert span.page_start == _page_of(pages, span.char_start)
        assert span.page_end == _page_of(pages, span.char_end - 1)
        assert span.page_end != 3 or span.page_start != 3, "a blank page has no chunk of its own"
    assert any(span.page_start < span.page_end for span in spans)
    assert any("XK-42-ZULU" in span.text and span.page_start <= 2 <= span.page_end for span in spans)
    # The model reads these whole: the longest chunk plus [CLS] and [SEP] fits its 256.
    assert max(span.token_count for span in spans) + 2 <= 256
    # Each chunk starts inside the previous one (a cut inside a sentence: they overlap), or right
    # after it, at the sentence, paragraph or page that the previous one ended with.
    text = document_text(pages)
    for before, after in zip(spans, spans[1:], strict=False):
        if after.char_start >= before.char_end:
            assert not text[before.char_end : after.char_start].strip()
            assert before.text.endswith((".", "?", "!", ";", ":")) or "\n\n" in text[before.char_end : after.char_start]


def test_each_passage_gets_the_title_of_the_section_it_starts_in():
    from documents.chunking import ChunkSpan, embedding_text, passage_headings

    text = "LEASE\n\n3. Rent. The rent is due monthly.\n\n4. Repairs. The tenant repairs the inside. More text here."

    def span(start: int, end: int) -> ChunkSpan:
        return ChunkSpan(index=0, page_start=1, page_end=1, char_start=start, char_end=end, text=text[start:end],
                         token_count=1)  # fmt: skip

    rent, repairs, inside = text.index("3. Rent"), text.index("4. Repairs"), text.index("The tenant")
    spans = [span(0, rent), span(rent, repairs), span(rent + 9, repairs), span(inside, len(text))]
    # The first starts with the document's title line and the second with its clause's title: they
    # hold their own. The third starts inside clause 3, the fourth inside clause 4.
    assert passage_headings(text, spans) == [None, None, "Rent", "Repairs"]
    assert embedding_text("The tenant repairs.", "Repairs") == "Repairs\nThe tenant repairs."
    assert embedding_text("Alone.", None) == "Alone."


def _spans_at(text: str, *starts: int) -> list:
    from documents.chunking import ChunkSpan

    return [
        ChunkSpan(index=i, page_start=1, page_end=1, char_start=a, char_end=len(text), text=text[a:], token_count=200)
        for i, a in enumerate(starts)
    ]


def test_a_running_header_and_a_lettered_item_are_not_a_sections_title():
    from documents.chunking import passage_headings

    page = "CONFIDENTIAL\n{body}\n\n"
    text = (
        page.format(body="11. Assignment. No party may assign this agreement without consent.")
        + page.format(body="(a) The Supplier shall deliver the goods to the Customer within ten days of the order.")
        + page.format(body="12. Notices. Notices are given in writing to the addresses above.")
    )
    after_header = [m.end() + 1 for m in re.finditer("CONFIDENTIAL", text)]
    # "CONFIDENTIAL" heads every page: no section's title. "(a) The Supplier shall ..." is an
    # item: the second page is still in clause 11. The third page starts with its own title.
    assert passage_headings(text, _spans_at(text, *after_header)) == [None, "Assignment", None]
    later = text.index("Notices are")
    assert passage_headings(text, _spans_at(text, later)) == ["Notices"]


def test_a_capitals_title_after_blank_lines_is_placed_at_its_first_letter():
    from documents.chunking import passage_headings
    from documents.rerank import title_places

    text = "Intro text here.\n\n" + "\n" * 5000 + "GOVERNING LAW\nThis agreement is governed by the laws of England."
    title = text.index("GOVERNING LAW")
    assert title_places(text) == [(title, "GOVERNING LAW")]  # not the blank lines before it
    # A passage that starts with its own title gets none in front; one inside the section, it.
    assert passage_headings(text, _spans_at(text, title, title + 20)) == [None, "GOVERNING LAW"]


def test_a_heading_that_would_push_its_passage_past_what_the_embedder_reads_is_left_out():
    from documents.chunking import passage_headings

    text = "7. Term and Termination. The agreement runs for two years and ends on notice."
    inside = text.index("The agreement")
    spans = _spans_at(text, inside)  # 200 tokens each

    def words(heading: str) -> int:
        return len(heading.split())

    assert passage_headings(text, spans, count_tokens=words, max_tokens=203) == ["Term and Termination"]
    assert passage_headings(text, spans, count_tokens=words, max_tokens=202) == [None]
