"""How many passages of each document hold each term: the words arm's term weights, read in one query.

The words arm of search (``documents.search``) weighs each term of a query by its rarity among the
passages searched (BM25's inverse document frequency), which needs, for every term, the number
of passages of the searched documents that hold it. Counted in the full-text index, that is one
count per term: up to ``search.MAX_QUERY_TERMS`` (100) for a letter's whole text, p50 250 ms for
the 38 to 60 terms of the reply gold set's letters over 100,000 passages in one document, 3.3 s
over the same passages in 5,000 documents (``bench ingest``; 0.9 and 33 ms from these rows). Here each document's counts are stored when its passages are
(``DocumentTerm``: one row per lexeme of its passages' ``search_vector``, and one, with the empty
term, for the number of its passages), so that the counts of all the terms over any set of
documents are one query on an index keyed by (term, document).

The terms are Postgres's own: the rows are read out of the stored ``search_vector``s
(``unnest``), and a query's term is normalised by ``to_tsvector`` with the same configuration
(``search.SEARCH_CONFIG``), so a term counts exactly the passages ``search_vector @@
plainto_tsquery(term)`` matches. A term that is several lexemes ("XK-42-ZULU" is the code and
its three parts, "term_sheet" two words) matches the passages holding all of them, which counts
per lexeme cannot give: those few are counted in the full-text index, as before, in the same
query.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection, transaction

# The row of a document whose term is empty holds its number of passages (no lexeme is empty).
PASSAGES = ""

_STORE = """
INSERT INTO documents_documentterm (document_id, term, passages)
SELECT %(document)s, lexeme, count(*)
FROM documents_chunk, unnest(search_vector) AS held(lexeme, positions, weights)
WHERE document_id = %(document)s
GROUP BY lexeme
UNION ALL
SELECT %(document)s, %(passages)s, count(*) FROM documents_chunk WHERE document_id = %(document)s
"""

# For each term, in order: its lexemes as the index has them; the passages holding its one
# lexeme, summed over the documents' rows; or, for a term of several lexemes, those holding all,
# counted in the full-text index as the words arm matches them. Row 0 is the passages in all.
_COUNTS = """
WITH terms AS (
    SELECT asked.place, asked.term, tsvector_to_array(to_tsvector(%(config)s::regconfig, asked.term)) AS lexemes
    FROM unnest(%(terms)s::text[]) WITH ORDINALITY AS asked(term, place)
)
SELECT 0, coalesce(sum(counted.passages), 0)
FROM documents_documentterm AS counted
WHERE counted.term = %(passages)s AND counted.document_id = ANY(%(documents)s)
UNION ALL
SELECT terms.place, CASE cardinality(terms.lexemes)
    WHEN 0 THEN 0
    WHEN 1 THEN (
        SELECT coalesce(sum(counted.passages), 0)
        FROM documents_documentterm AS counted
        WHERE counted.term = terms.lexemes[1] AND counted.document_id = ANY(%(documents)s)
    )
    ELSE (
        SELECT count(*)
        FROM documents_chunk AS chunk
        WHERE chunk.document_id = ANY(%(documents)s)
            AND chunk.search_vector @@ plainto_tsquery(%(config)s::regconfig, terms.term)
    )
END
FROM terms
"""


def store_document_terms(document_id: int) -> None:
    """Count the terms of the document's stored passages (their ``search_vector``, already
    computed), replacing the counts it had. Call it in the transaction that stores them."""
    forget_document_terms(document_id)
    with connection.cursor() as cursor:
        cursor.execute(_STORE, {"document": document_id, "passages": PASSAGES})


def documents_count_terms(document_ids: Sequence[int] | None = None) -> int:
    """Count again the terms of these documents' stored passages (of every document with
    passages, by default), each in a transaction of its own under its row's lock (as a reader
    storing its passages holds it). For documents stored before the counts were, or whose
    ``search_vector``s were computed again. Returns how many documents were counted."""
    from documents.models import Chunk, Document

    if document_ids is None:
        document_ids = list(Chunk.objects.order_by().values_list("document_id", flat=True).distinct())
    counted = 0
    for document_id in sorted(set(document_ids)):
        with transaction.atomic():
            if Document.objects.select_for_update().filter(pk=document_id).exists():
                store_document_terms(document_id)
                counted += 1
    return counted


def forget_document_terms(document_id: int) -> None:
    """Remove the document's counts (its passages are being removed; deleting the document
    removes them too)."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM documents_documentterm WHERE document_id = %s", [document_id])


def passage_counts(document_ids: Sequence[int], terms: Sequence[str], *, config: str) -> tuple[int, list[int]]:
    """(passages of these documents, and for each term the number of them that hold it): one
    query. ``config`` is the text-search configuration the passages' vectors were made with."""
    with connection.cursor() as cursor:
        cursor.execute(
            _COUNTS,
            {"config": config, "terms": list(terms), "documents": list(document_ids), "passages": PASSAGES},
        )
        counts = dict(cursor.fetchall())
    return int(counts[0]), [int(counts[place]) for place in range(1, len(terms) + 1)]


def passage_counts_from_index(
    document_ids: Sequence[int], terms: Sequence[str], *, config: str
) -> tuple[int, list[int]]:
    """The same counts as ``passage_counts``, each term's in the full-text index: one count per
    term, as the words arm counted before the stored counts. The reference that the tests and
    ``bench ingest`` check the stored counts against."""
    from django.contrib.postgres.search import SearchQuery

    from documents.models import Chunk

    chunks = Chunk.objects.filter(document_id__in=list(document_ids))
    return chunks.count(), [
        chunks.filter(search_vector=SearchQuery(term, search_type="plain", config=config)).count() for term in terms
    ]
