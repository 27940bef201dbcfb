"""``manage.py count_document_terms``: count again the terms of documents' stored passages.

The words arm of search reads its term weights from these counts (``documents.term_counts``).
They are written with a document's passages and, for the passages stored before, by migration
0008; this counts them again, for every document with passages or those named, after anything
that computed ``search_vector`` again outside the ingest (a migration that reindexes, a restore
of the passages without their counts):

    python manage.py count_document_terms
    python manage.py count_document_terms --document 12 --document 40
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from documents.term_counts import documents_count_terms


class Command(BaseCommand):
    help = "Count again the terms of documents' passages, which the words arm of search weighs its terms by."

    def add_arguments(self, parser):
        parser.add_argument(
            "--document", type=int, action="append", dest="documents", help="a document's id (repeatable)"
        )

    def handle(self, *args, **options):
        counted = documents_count_terms(options["documents"])
        self.stdout.write(f"counted the terms of {counted} document(s)")
