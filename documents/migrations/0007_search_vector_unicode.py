"""Chunks stored before the words arm read no-break and other Unicode spaces as spaces
(``documents.search.chunk_search_vector``): their words joined by such spaces could not be found
by the words arm. Only the chunks that hold one are indexed again; the text is unchanged."""

from django.db import migrations

# documents.search.UNICODE_SPACES as of this migration (a migration does not follow later edits).
UNICODE_SPACES = "[\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"

REINDEX = """
UPDATE documents_chunk
SET search_vector = to_tsvector('english', regexp_replace(text, %s, ' ', 'g'))
WHERE text ~ %s
"""


class Migration(migrations.Migration):
    dependencies = [("documents", "0006_document_reader")]

    operations = [
        migrations.RunSQL(sql=[(REINDEX, [UNICODE_SPACES, UNICODE_SPACES])], reverse_sql=migrations.RunSQL.noop),
    ]
