"""Changing the embedding model re-embeds what was embedded with the old one."""

from __future__ import annotations

import pytest
from django.core.files.base import ContentFile

from documents import services
from documents.embeddings import get_embedder, model_path
from documents.models import Chunk, Document, Page

pytestmark = pytest.mark.django_db


def test_documents_embedded_with_another_model_are_found_and_reembedded(alice):
    text = "The warehouse lease in Leeds ends in June; the landlord wants six months' notice."
    document = Document(
        owner=alice, title="lease", filename="lease.txt", kind=Document.Kind.TEXT, size_bytes=len(text),
        sha256="1" * 64, state=Document.State.READY, pages_total=1, embedding_model="an-older-model",
    )  # fmt: skip
    document.file.save("lease.txt", ContentFile(text.encode()), save=False)
    document.save()
    Page.objects.create(document=document, number=1, text=text, char_start=0)
    Chunk.objects.create(
        document=document, index=0, page_start=1, page_end=1, char_start=0, char_end=len(text), text=text,
        token_count=10, embedding=[0.0] * 384, embedding_model="an-older-model",
    )  # fmt: skip
    current = model_path()[1]
    assert current == get_embedder().model_name
    assert list(services.documents_needing_reembedding(current)) == [document]

    services.document_embed(document_id=document.pk)

    document.refresh_from_db()
    assert document.state == Document.State.READY and document.embedding_model == current
    chunks = list(Chunk.objects.filter(document=document))
    assert chunks and {c.embedding_model for c in chunks} == {current}
    assert any(abs(x) > 0 for x in chunks[0].embedding)  # a real vector replaced the zeros
    assert not services.documents_needing_reembedding(current).exists()
