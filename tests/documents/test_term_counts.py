"""Per-document term counts (``documents.term_counts``), on the real database with documents
ingested by the ingest's own code: the words arm's weights read from them are the weights counted
in the full-text index, and they follow the passages (stored, replaced, deleted, counted again)."""

from __future__ import annotations

import importlib
import math

import pytest
from django.contrib.auth.models import User
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.db import connection

from documents import services
from documents.models import Chunk, Document, DocumentTerm
from documents.search import SEARCH_CONFIG, significant_terms, term_weights, text_search
from documents.term_counts import PASSAGES, passage_counts, passage_counts_from_index
from inference.drafting import retrieval_queries
from measure.evaluation.gold import GOLD_DIR, load_gold_set
from tests.factories import ready_document

# Terms of several lexemes (a code and its parts, hyphenated words, words joined by "_"), one
# that is only a function word to the index, and one no passage has.
ODD_TERMS = ["xk-42-zulu", "hmi-cb-7730142", "non-disclosure", "long-term", "licensee's", "notice_period", "until"]


def _ingest(owner: User, names: list[str]) -> list[Document]:
    documents = []
    for name in names:
        data = (GOLD_DIR / "documents" / f"{name}.txt").read_bytes()
        document, _ = services.document_create(
            owner=owner, upload=SimpleUploadedFile(f"{name}.txt", data, content_type=""), ingest_here=True
        )
        document.refresh_from_db()
        assert document.state == Document.State.READY, document.failure_reason
        documents.append(document)
    return documents


def _letters_terms() -> list[list[str]]:
    """The terms of each reply gold set letter's whole text, as a draft searches it first."""
    return [significant_terms(retrieval_queries(case.message)[0]) for case in load_gold_set().replies]


def _agree(document_ids: list[int], terms: list[str]) -> tuple[int, list[int]]:
    stored = passage_counts(document_ids, terms, config=SEARCH_CONFIG)
    assert stored == passage_counts_from_index(document_ids, terms, config=SEARCH_CONFIG), terms
    return stored


@pytest.mark.django_db
def test_weights_from_the_stored_counts_are_the_weights_counted_in_the_full_text_index(alice):
    documents = _ingest(alice, ["contract-03", "facts-07"])
    ids = [document.pk for document in documents]
    assert DocumentTerm.objects.filter(document_id__in=ids).exists()
    held = 0
    for terms in [*_letters_terms(), ODD_TERMS]:
        for subset in (ids, ids[:1]):
            total, counts = _agree(subset, terms)
            assert total == Chunk.objects.filter(document_id__in=subset).count()
            held += sum(1 for n in counts if n)
            # The weights are BM25's idf of the counts the full-text index gives, as before.
            expected = [math.log(1 + (total - n + 0.5) / (n + 0.5)) if n else 0.0 for n in counts]
            assert term_weights(subset, terms) == pytest.approx(expected, rel=1e-12)
    assert held > 50  # the letters' terms are in these documents, not only absent


@pytest.mark.django_db
def test_a_library_stored_its_terms_with_its_passages_and_loses_them_with_the_document(alice):
    kept = ready_document(alice, "Lease", ["The tenant pays the rent monthly.", "The landlord repairs the roof."])
    gone = ready_document(alice, "Escrow", ["Code held in escrow under XK-42-ZULU.", "Escrow ends on insolvency."])
    assert DocumentTerm.objects.get(document=gone, term=PASSAGES).passages == 2
    assert DocumentTerm.objects.get(document=gone, term="escrow").passages == 2
    assert DocumentTerm.objects.get(document=kept, term="rent").passages == 1
    # "xk-42-zulu" is the code and its three parts: the passages that hold all four.
    assert _agree([kept.pk, gone.pk], ["escrow", "rent", "xk-42-zulu", "zulu"]) == (4, [2, 1, 1, 1])
    assert [pk for pk, _ in text_search("escrow", limit=5, user=alice)]

    services.document_delete(document=gone, user=alice)

    assert not DocumentTerm.objects.filter(document_id=gone.pk).exists()
    assert DocumentTerm.objects.filter(document=kept).exists()
    assert _agree([kept.pk, gone.pk], ["escrow", "rent", "xk-42-zulu"]) == (2, [0, 1, 0])


@pytest.mark.django_db
def test_passages_stored_again_are_counted_again(alice):
    document = ready_document(alice, "Notice", ["The notice period is three months.", "Pay is monthly."])
    assert _agree([document.pk], ["notice", "pay", "holiday"]) == (2, [1, 1, 0])
    replaced = Chunk.objects.get(document=document, index=0)
    replaced.pk = None
    replaced.text = "Holiday is twenty days; holiday pay is the usual pay."
    services.passages_store(document=document, chunks=[replaced])
    assert _agree([document.pk], ["notice", "pay", "holiday"]) == (1, [0, 1, 1])
    assert DocumentTerm.objects.get(document=document, term="holiday").passages == 1


@pytest.mark.django_db
def test_the_migration_and_the_command_count_the_passages_stored_before(alice):
    documents = [
        ready_document(alice, "Lease", ["The tenant pays the rent monthly.", "Rent reviews are yearly."]),
        ready_document(alice, "Escrow", ["Code held in escrow under XK-42-ZULU.", "Escrow ends on insolvency."]),
    ]
    ids = [document.pk for document in documents]
    terms = ["rent", "escrow", "xk-42-zulu", "yearly", "code"]
    expected = passage_counts_from_index(ids, terms, config=SEARCH_CONFIG)
    migration = importlib.import_module("documents.migrations.0008_document_terms")

    DocumentTerm.objects.all().delete()  # as stored before the counts were
    # Without them a term of one lexeme is in no passage (the code, of four, is counted in the index).
    assert passage_counts(ids, terms, config=SEARCH_CONFIG) == (0, [0, 0, 1, 0, 0])
    with connection.cursor() as cursor:
        cursor.execute(migration.BACKFILL)
    assert passage_counts(ids, terms, config=SEARCH_CONFIG) == expected

    DocumentTerm.objects.filter(document_id=ids[1]).delete()
    call_command("count_document_terms", "--document", str(ids[1]))
    assert passage_counts(ids, terms, config=SEARCH_CONFIG) == expected
    DocumentTerm.objects.all().delete()
    call_command("count_document_terms")
    assert passage_counts(ids, terms, config=SEARCH_CONFIG) == expected
