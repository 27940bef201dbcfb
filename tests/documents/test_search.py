"""Hybrid search on the real database (Postgres + pgvector) with the real embedding model."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools

import pytest
from django.contrib.auth.models import AnonymousUser, Group, User
from django.contrib.postgres.search import SearchQuery, SearchVector
from django.db import connection

from documents.chunking import chunk_pages, pages_with_offsets
from documents.embeddings import embed_spans, get_embedder
from documents.models import Chunk, Document, Page
from documents.search import (
    exact_vector_search,
    explain_vector_search,
    readable_documents,
    reciprocal_rank_fusion,
    search_passages,
    text_search,
    vector_search,
)
from documents.services import chunk_rows, passages_store

_serial = itertools.count()

CONTRACT = [
    "Services agreement between Northwind Ltd, the supplier, and Contoso plc, the customer. "
    "The supplier maintains the customer's payroll software and answers support calls on working days.",
    "Fees and payment. Invoices are due within thirty days of receipt. Late payments accrue interest "
    "at two per cent per month until the invoice is paid in full.",
    "Escrow. The source code is deposited with an escrow agent under reference XK-42-ZULU, "
    "to be released if the supplier becomes insolvent.",
]
RELOCATION = [
    "Office relocation plan. The London office moves to Leeds in March. "
    "Every member of staff gets two days of paid leave to help with the move.",
]
CENSUS = ["Quarterly penguin census: 412 emperor penguins were counted on the island colony this winter."]
GARDEN = ["Garden maintenance schedule: the hedges are trimmed every six weeks and the lawn mowed weekly."]


@pytest.fixture(scope="module")
def embedder():
    return get_embedder()


def _document(owner, title: str, pages: list[str], embedder, *, state=Document.State.READY) -> Document:
    serial = next(_serial)
    document = Document.objects.create(
        owner=owner,
        title=title,
        filename=f"{title}.pdf",
        size_bytes=1,
        sha256=hashlib.sha256(f"{title}{serial}".encode()).hexdigest(),
        file=f"documents/test/{serial}.pdf",
        state=state,
        pages_total=len(pages),
        pages_done=len(pages),
        embedding_model=embedder.model_name,
    )
    page_texts = pages_with_offsets(pages)
    Page.objects.bulk_create(
        [Page(document=document, number=p.number, text=p.text, char_start=p.char_start) for p in page_texts]
    )
    # Each page here is a passage of its own (or a few, if long): chunked alone, placed at its offset.
    spans = []
    for page in page_texts:
        for span in chunk_pages([(page.number, 0, page.text)], embedder.tokenizer, max_tokens=48, overlap_tokens=8):
            spans.append(
                dataclasses.replace(
                    span,
                    index=len(spans),
                    char_start=page.char_start + span.char_start,
                    char_end=page.char_start + span.char_end,
                )
            )
    vectors = embed_spans(embedder, spans)
    passages_store(document=document, chunks=chunk_rows(document, spans, vectors, embedder.model_name))
    return document


@pytest.fixture
def library(db, embedder):
    alice = User.objects.create_user("alice")
    bob = User.objects.create_user("bob")
    carol = User.objects.create_user("carol")
    facilities = Group.objects.create(name="facilities")
    carol.groups.add(facilities)
    contract = _document(alice, "Payroll services contract", CONTRACT, embedder)
    relocation = _document(alice, "Relocation plan", RELOCATION, embedder)
    relocation.shared_with.add(facilities)
    census = _document(alice, "Penguin census", CENSUS, embedder, state=Document.State.EMBEDDING)
    garden = _document(bob, "Garden schedule", GARDEN, embedder)
    return {
        "alice": alice,
        "bob": bob,
        "carol": carol,
        "contract": contract,
        "relocation": relocation,
        "census": census,
        "garden": garden,
    }


def _search(user, query, embedder, **kwargs):
    return search_passages(user=user, query=query, embedder=embedder, **kwargs)


def test_finds_the_passage_with_its_document_and_page(library, embedder):
    passages = _search(library["alice"], "When do invoices have to be paid?", embedder)
    top = passages[0]
    assert top.document_id == library["contract"].pk
    assert top.document_title == "Payroll services contract"
    assert top.page_start <= 2 <= top.page_end
    assert "thirty days" in top.text
    chunk = Chunk.objects.get(pk=top.chunk_id)
    assert (top.char_start, top.char_end, top.text) == (chunk.char_start, chunk.char_end, chunk.text)
    assert [p.score for p in passages] == sorted((p.score for p in passages), reverse=True)
    assert len(passages) == len({p.chunk_id for p in passages})


def test_a_code_word_is_found_by_the_full_text_arm(library, embedder):
    alice = library["alice"]
    (hit,) = text_search("XK-42-ZULU", limit=10, user=alice)  # one chunk has it
    assert "XK-42-ZULU" in Chunk.objects.get(pk=hit[0]).text
    passages = _search(alice, "XK-42-ZULU", embedder)
    assert passages[0].chunk_id == hit[0]
    assert passages[0].page_start <= 3 <= passages[0].page_end
    # Fused: the top passage is ranked by both arms, or first by words.
    assert passages[0].score >= 1 / 61


@pytest.fixture(params=["exact", "hnsw"])
def meaning_arm(request, settings, db):
    """Both ways the meaning arm searches: exactly over few readable chunks (the default at this
    size), and through the HNSW index: a threshold of 0, and (for the rest of this test's
    transaction) no plan without it, since for a table this small Postgres would rather sort."""
    if request.param == "hnsw":
        settings.APPLIANCE_SEARCH_EXACT_MAX_CHUNKS = 0
        with connection.cursor() as cursor:
            cursor.execute(
                "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_sort = off"
            )
    return request.param


def test_others_do_not_see_private_documents_even_for_an_exact_query(library, embedder, meaning_arm):
    bob, contract = library["bob"], library["contract"]
    exact_text = Chunk.objects.filter(document=contract).order_by("index").first().text
    for query in (exact_text, "XK-42-ZULU", "invoices thirty days"):
        passages = _search(bob, query, embedder)
        assert {p.document_id for p in passages} <= {library["garden"].pk}
        found_by_words = [chunk_id for chunk_id, _ in text_search(query, limit=50, user=bob)]
        assert not Chunk.objects.filter(pk__in=found_by_words).exclude(document=library["garden"]).exists()
    query_vector = embedder.encode([exact_text])[0]
    nearest = vector_search(query_vector, limit=50, user=bob)
    assert set(Chunk.objects.filter(pk__in=[c for c, _ in nearest]).values_list("document_id", flat=True)) == {
        library["garden"].pk
    }
    assert _search(AnonymousUser(), exact_text, embedder) == []


def test_group_members_see_shared_documents_only(library, embedder, meaning_arm):
    carol = library["carol"]
    passages = _search(carol, "Where is the office moving to?", embedder)
    assert passages[0].document_id == library["relocation"].pk
    assert {p.document_id for p in passages} == {library["relocation"].pk}
    assert library["contract"].pk not in {p.document_id for p in _search(carol, "XK-42-ZULU", embedder)}
    assert text_search("XK-42-ZULU", limit=10, user=carol) == []
    readable = set(readable_documents(carol).values_list("pk", flat=True))
    assert readable == {library["relocation"].pk}
    # Shared with two of her groups: still one row.
    second = Group.objects.create(name="all staff")
    carol.groups.add(second)
    library["relocation"].shared_with.add(second)
    assert readable_documents(carol).count() == 1


def test_document_ids_restrict_the_search(library, embedder):
    alice = library["alice"]
    passages = _search(alice, "invoices payment", embedder, document_ids=[library["relocation"].pk])
    assert passages and {p.document_id for p in passages} == {library["relocation"].pk}
    # Naming a document one may not read does not open it.
    assert _search(alice, "hedges trimmed", embedder, document_ids=[library["garden"].pk]) == []
    assert _search(alice, "hedges trimmed", embedder, document_ids=[]) == []


def test_documents_not_ready_are_not_searched(library, embedder):
    alice, census = library["alice"], library["census"]
    passages = _search(alice, "how many penguins were counted", embedder)
    assert census.pk not in {p.document_id for p in passages}
    Document.objects.filter(pk=census.pk).update(state=Document.State.READY)
    passages = _search(alice, "how many penguins were counted", embedder)
    assert passages[0].document_id == census.pk


def test_index_search_agrees_with_exact_search_and_settings_do_not_leak(library, embedder, meaning_arm):
    alice = library["alice"]
    query_vector = embedder.encode(["payroll software support"])[0]
    plan = explain_vector_search(query_vector, limit=5, user=alice)
    assert ("chunk_embedding_hnsw" in plan) == (meaning_arm == "hnsw")
    approximate = vector_search(query_vector, limit=5, user=alice)
    exact = exact_vector_search(query_vector, 5, user=alice)
    assert [c for c, _ in approximate] == [c for c, _ in exact]
    assert [d for _, d in approximate] == sorted(d for _, d in approximate)
    everyone = exact_vector_search(query_vector, 50)
    assert {c for c, _ in exact} <= {c for c, _ in everyone}
    # The tests run inside a transaction: SET LOCAL must not outlive the search.
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('enable_indexscan'), current_setting('hnsw.ef_search')")
        assert cursor.fetchone() == ("on", "40")


def test_reciprocal_rank_fusion():
    fused = reciprocal_rank_fusion([[1, 2, 3], [3, 1]], k=60)
    assert [item for item, _ in fused] == [1, 3, 2]
    assert fused[0][1] == pytest.approx(1 / 61 + 1 / 62)
    assert reciprocal_rank_fusion([[], []]) == []


def test_the_words_arm_finds_a_passage_from_a_long_message_by_any_of_its_terms(library, embedder):
    alice = library["alice"]
    message = (
        "Dear Sir, following our meeting last week about the payroll system, could you please tell me how "
        "quickly your invoices must be settled and what happens to late payments? Kind regards, Dana"
    )
    # All of its words together are in no passage: matching them all (websearch_to_tsquery) finds nothing.
    assert not Chunk.objects.filter(search_vector=SearchQuery(message, search_type="websearch", config="english"))
    hits = text_search(message, limit=10, user=alice)
    fees = Chunk.objects.get(pk=hits[0][0])
    assert "Late payments" in fees.text  # the passage with the most of its terms comes first
    assert [score for _, score in hits] == sorted((score for _, score in hits), reverse=True)


def test_the_words_arm_weighs_a_rare_term_above_words_every_passage_has(db, embedder):
    owner = User.objects.create_user("dana")
    filler = " It was typed in London on plain paper, read aloud twice, filed in the cabinet, and copied for the records office."
    clauses = _document(owner, "Supply agreement", [
        "This agreement is made between the party named below and the other party." + filler,
        "Rights under it may be assigned only with written consent." + filler,
        "This agreement binds each party and its successors." + filler,
        "Each party signs this agreement in two copies." + filler,
    ], embedder)  # fmt: skip
    hits = text_search("Can a party assign this agreement?", limit=10, user=owner, document_ids=[clauses.pk])
    top = Chunk.objects.get(pk=hits[0][0])
    # "party" and "agreement" are in three passages of four; "assign" in one: it decides.
    assert "assigned only with written consent" in top.text
    assert len(hits) == 4


def test_the_words_arm_counts_how_often_a_passage_holds_a_rare_term(db, embedder):
    owner = User.objects.create_user("gail")
    document = _document(owner, "Subscription agreement", [
        "Service credits: a credit is 5% of the fee, and credits are set off against the next invoice.",
        "The customer may claim a credit.",
        "The customer pays the fees yearly.",
        "The customer names a contact for support.",
        "The customer keeps its data backed up.",
        "Either party may end this agreement with the customer.",
    ], embedder)  # fmt: skip
    hits = text_search("What credit is the customer owed?", limit=10, user=owner, document_ids=[document.pk])
    first = Chunk.objects.get(pk=hits[0][0])
    # "credit", in two passages of six, three times in the first: it outweighs the second's
    # "credit" once with "customer", which five passages of six hold (counted once each, the
    # second would come first).
    assert first.text.startswith("Service credits")
    assert "claim a credit" in Chunk.objects.get(pk=hits[1][0]).text


def test_words_beside_unicode_spaces_quotes_and_dashes_are_found_by_the_words_arm(db, embedder):
    # Postgres's parser, in the C locale, reads every character outside ASCII as a letter:
    # "Fox\u00a0shall\u00a0earn" (PDFs printed from HTML put U+00A0 between most words),
    # "Licensee\u2019s" and "\u201cTerritory\u201d" would each be one word that no query finds.
    owner = User.objects.create_user("erin")
    text = (
        "Licensee\u2019s royalties at the rate of".replace(" ", "\u00a0")
        + "\u202ften\u2009percent\u2014payable in the \u201cTerritory\u201d \u00a7 4.2 at \u20ac1,000 per "
        "year\u2026 in 2019\u20132020 unless exten\u00added."
    )
    document = _document(owner, "Licence", [text], embedder)
    # "2020": a dash between numbers reads as a space (Postgres reads "2019-2020" as 2019 and -2020).
    for term in ("licensee", "royalties", "ten", "percent", "payable", "territory", "year", "2020", "extended"):
        hits = text_search(f"What {term}?", limit=5, user=owner, document_ids=[document.pk])
        assert [Chunk.objects.get(pk=pk).document_id for pk, _ in hits] == [document.pk], term
    assert Chunk.objects.get(document=document).text == text  # only what the index reads is translated


def test_the_migration_indexes_again_the_chunks_stored_with_unicode_read_as_letters(db, embedder):
    import importlib

    migration = importlib.import_module("documents.migrations.0007_search_vector_unicode")
    # Its frozen copy reads no-break spaces as spaces and curly quotes as ASCII ones, as the index did then.
    for character, read_as in (("\u00a0", " "), ("\u2019", "'"), ("\u201c", '"'), ("\u2011", "-"), ("\u2013", " ")):
        assert migration.TRANSLATE_TO[migration.TRANSLATE_FROM.index(character)] == read_as
    assert (
        migration.TRANSLATE_FROM.endswith("\u00ad") and len(migration.TRANSLATE_TO) == len(migration.TRANSLATE_FROM) - 1
    )
    owner = User.objects.create_user("frank")
    spaced = _document(owner, "Spaced", ["The licence is perpetual and irrevocable.".replace(" ", "\u00a0")], embedder)
    quoted = _document(owner, "Quoted", ["The \u201cLicensor\u201d is not liable."], embedder)
    plain = _document(owner, "Plain", ["The licence is perpetual, said the other paper."], embedder)
    Chunk.objects.update(search_vector=SearchVector("text", config="english"))  # as stored before
    assert [pk for pk, _ in text_search("irrevocable licensor", limit=5, user=owner)] == []
    untouched = {c.pk: c.search_vector for c in Chunk.objects.filter(document=plain)}
    with connection.cursor() as cursor:
        cursor.execute(migration.REINDEX, [migration.TRANSLATE_FROM, migration.TRANSLATE_TO, migration.ANY_OF_THEM])
        assert cursor.rowcount == Chunk.objects.filter(document__in=[spaced, quoted]).count()  # only those
    found = {Chunk.objects.get(pk=pk).document_id for pk, _ in text_search("irrevocable licensor", limit=5, user=owner)}
    assert found == {spaced.pk, quoted.pk}
    assert {c.pk: c.search_vector for c in Chunk.objects.filter(document=plain)} == untouched


def test_significant_terms_keep_codes_and_numbers_and_drop_function_words():
    from documents.search import significant_terms

    # A code pasted with Unicode hyphens is the code the index holds; a curly apostrophe is one.
    assert significant_terms("XK\u201042\u2010ZULU, the Licensee\u2019s") == ["xk-42-zulu", "licensee's"]

    assert significant_terms("What is the fee for XK-42-ZULU in 2024, and the fee?") == ["fee", "xk-42-zulu", "2024"]
    assert significant_terms("Dear Sir, could you please let me know") == ["sir"]
    # Every term of a letter's query (cut at 1,000 characters), the later paragraphs' too.
    letter = " ".join(f"word{i}" for i in range(90))
    assert len(letter) > 500 and significant_terms(letter)[-1] == "word89"
    assert len(significant_terms(" ".join(f"word{i}" for i in range(300)))) == 100
