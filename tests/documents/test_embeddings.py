"""The real embedding model, loaded offline from its wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from documents.chunking import ChunkSpan
from documents.embeddings import EMBEDDER_WARM_LOG, embed_spans, get_embedder, load_ahead


@pytest.fixture(scope="module")
def embedder():
    return get_embedder()


BASE_DIR = Path(__file__).resolve().parents[2]


def test_loads_with_no_network_and_no_offline_flag_set():
    """In a fresh process with no HF_HUB_OFFLINE and the hub pointed at a closed port: any
    download attempt would fail the load."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HF_")}
    env.update(
        DJANGO_SETTINGS_MODULE="appliance.settings",
        HF_ENDPOINT="http://127.0.0.1:9",
        APPLIANCE_VAR_DIR=str(BASE_DIR / "var" / "test"),
    )
    code = (
        "import django, os; django.setup()\n"
        "from documents.embeddings import get_embedder\n"
        "e = get_embedder(); v = e.encode(['hello'])\n"
        "import torch\n"
        "print(os.environ['HF_HUB_OFFLINE'], e.model_name, v.shape[1], torch.get_num_threads())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # No GPU here: the engine runs on the CPU, and embedding keeps to one thread beside it.
    assert result.stdout.split() == ["1", "all-MiniLM-L6-v2", "384", "1"]


def test_embedding_threads_are_one_beside_a_cpu_engine_unless_set(settings):
    from documents.embeddings import embedding_threads

    settings.APPLIANCE_EMBEDDING_THREADS = 0
    assert embedding_threads() == 1  # no GPU on this machine
    settings.APPLIANCE_EMBEDDING_THREADS = 3
    assert embedding_threads() == 3


def test_loads_once_per_process(embedder):
    assert get_embedder() is embedder
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(get_embedder())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(other is embedder for other in seen)
    assert embedder.model_name == "all-MiniLM-L6-v2"
    assert embedder.dimensions == 384
    assert embedder.max_seq_tokens == 256


def test_loading_ahead_logs_when_ready_and_a_failure_is_logged_not_raised(caplog):
    # Fakes of the loader: the real one is the workers' (tests/inference/test_jobs.py).
    loaded = []
    with caplog.at_level("INFO", logger="documents.embeddings"):
        load_ahead(lambda: loaded.append("embedder")).join(timeout=10)
    assert loaded == ["embedder"] and EMBEDDER_WARM_LOG in caplog.text
    caplog.clear()

    def broken():
        raise FileNotFoundError("the embedding model directory /nowhere does not exist")

    with caplog.at_level("INFO", logger="documents.embeddings"):
        thread = load_ahead(broken)
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert "could not be loaded ahead of the first job" in caplog.text and "/nowhere" in caplog.text
    assert EMBEDDER_WARM_LOG not in caplog.text


def test_vectors_are_unit_length_float32(embedder):
    vectors = embedder.encode(["The invoice is due in 30 days.", "", "Ünïcödé and 漢字 too."])
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert embedder.encode([]).shape == (0, 384)


def test_similar_sentences_are_closer_than_unrelated_ones(embedder):
    invoice, payment, weather = embedder.encode(
        [
            "Invoices must be paid within thirty days of receipt.",
            "Payment is due 30 days after the invoice arrives.",
            "The alpine meadow was covered in snow this morning.",
        ]
    )
    assert float(invoice @ payment) > float(invoice @ weather) + 0.3


def test_embed_spans_keeps_order(embedder):
    spans = [
        ChunkSpan(index=i, page_start=1, page_end=1, char_start=0, char_end=len(text), text=text, token_count=1)
        for i, text in enumerate(["termination with notice", "a recipe for bread", "ending the contract early"])
    ]
    vectors = embed_spans(embedder, spans, batch_size=2)
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(vectors, embedder.encode([span.text for span in spans]), atol=1e-5)
    assert float(vectors[0] @ vectors[2]) > float(vectors[0] @ vectors[1])
    # Under their sections' titles, as the ingest embeds them.
    titled = embed_spans(embedder, spans, headings=["Termination", None, "Termination"])
    expected = embedder.encode(["Termination\ntermination with notice", "a recipe for bread",
                                "Termination\nending the contract early"])  # fmt: skip
    np.testing.assert_allclose(titled, expected, atol=1e-5)
