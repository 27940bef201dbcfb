"""Per-document term counts (``DocumentTerm``, ``documents.term_counts``): the words arm's term
weights in one query instead of one full-text count per term. Created, then filled for the
passages already stored, from their ``search_vector`` (so they count what the index matches)."""

import django.db.models.deletion
from django.db import migrations, models

# documents.term_counts._STORE for every document at once, as of this migration; the empty term
# counts a document's passages.
BACKFILL = """
INSERT INTO documents_documentterm (document_id, term, passages)
SELECT document_id, lexeme, count(*)
FROM documents_chunk, unnest(search_vector) AS held(lexeme, positions, weights)
GROUP BY document_id, lexeme
UNION ALL
SELECT document_id, '', count(*) FROM documents_chunk GROUP BY document_id
"""


class Migration(migrations.Migration):
    dependencies = [
        ("documents", "0007_search_vector_unicode"),
    ]

    operations = [
        migrations.CreateModel(
            name="DocumentTerm",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "term", "document", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("term", models.TextField()),
                ("passages", models.PositiveIntegerField()),
                (
                    "document",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="documents.document",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["term", "document"], include=("passages",), name="document_term_by_term")
                ],
            },
        ),
        migrations.RunSQL(sql=BACKFILL, reverse_sql=migrations.RunSQL.noop),
    ]
