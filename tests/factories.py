"""Test data built the way ingestion leaves it, without running ingestion."""

from __future__ import annotations

from django.core.files.base import ContentFile

from documents.models import Chunk, Document, Page
from documents.services import passages_store


def ready_document(owner, title: str, text: str | list[str]) -> Document:
    """A ready document: its pages, and one chunk a page embedded with the real embedder and
    indexed for words, as search expects."""
    from documents.embeddings import get_embedder

    pages = [text] if isinstance(text, str) else list(text)
    joined = "\n\n".join(pages)
    document = Document(
        owner=owner, title=title, filename=f"{title}.txt", kind=Document.Kind.TEXT, size_bytes=len(joined),
        sha256=title.ljust(64, "0")[:64], state=Document.State.READY, pages_total=len(pages), pages_done=len(pages),
    )  # fmt: skip
    document.file.save(f"{title}.txt", ContentFile(joined.encode()), save=False)
    document.save()
    embedder = get_embedder()
    vectors = embedder.encode(pages)
    start = 0
    chunks = []
    for number, (page, vector) in enumerate(zip(pages, vectors, strict=True), start=1):
        Page.objects.create(document=document, number=number, text=page, char_start=start)
        chunks.append(Chunk(
            document=document, index=number - 1, page_start=number, page_end=number, char_start=start,
            char_end=start + len(page), text=page, token_count=len(page.split()), embedding=vector.tolist(),
            embedding_model=embedder.model_name,
        ))  # fmt: skip
        start += len(page) + 2
    passages_store(document=document, chunks=chunks)
    return document


def model_dir(path, *, layers=30, heads=9, kv_heads=3, head_dim=64, parameters=135_000, dtype="bfloat16"):
    """A model directory as the capacity planner reads it: a Hugging Face ``config.json`` and one
    safetensors file whose header declares ``parameters`` weights (the tensor bytes are not needed)."""
    import json
    import struct

    path.mkdir(parents=True, exist_ok=True)
    config = {
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "hidden_size": heads * head_dim, "dtype": dtype,
    }  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    header = json.dumps({"weight": {"dtype": "BF16", "shape": [parameters], "data_offsets": [0, 2 * parameters]}})
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode())
    return path
