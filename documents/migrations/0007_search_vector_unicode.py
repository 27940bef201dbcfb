"""Chunks stored before the words arm read Unicode spaces, quotes, dashes and other punctuation
as ASCII (``documents.search.chunk_search_vector``): Postgres's parser, in the C locale, reads
every character outside ASCII as a letter, so their words joined by a no-break space or quoted
with curly quotes could not be found by the words arm. Only the chunks that hold one of those
characters are indexed again; the text is unchanged."""

from django.db import migrations

# documents.search.INDEX_TRANSLATE_FROM and _TO as of this migration (a migration does not
# follow later edits).
TRANSLATE_FROM = "\u2018\u2019\u201a\u201b\u2032\u201c\u201d\u201e\u201f\u00ab\u00bb\u2039\u203a\u2033\u2010\u2011\u2212\u2012\u2013\u2014\u2015\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\u2022\u00b7\u00a7\u00b6\u2020\u2021\u2026\u20ac\u00a3\u00a5\u00a9\u00ae\u2122\u00b0\u00b1\u00d7\u00f7\u00ad"
TRANSLATE_TO = '\'\'\'\'\'"""""""""---                                       '
ANY_OF_THEM = "[" + TRANSLATE_FROM + "]"

REINDEX = """
UPDATE documents_chunk
SET search_vector = to_tsvector('english', translate(text, %s, %s))
WHERE text ~ %s
"""


class Migration(migrations.Migration):
    dependencies = [("documents", "0006_document_reader")]

    operations = [
        migrations.RunSQL(
            sql=[(REINDEX, [TRANSLATE_FROM, TRANSLATE_TO, ANY_OF_THEM])], reverse_sql=migrations.RunSQL.noop
        ),
    ]
