"""inference/engine/model_prep.py: checksums and verification (the real conversion is not run)."""

from __future__ import annotations

import hashlib
import json

import pytest

from inference.engine.model_prep import (
    CONVERSION_VERSION,
    MANIFEST_NAME,
    ModelPreparationError,
    check_model_dir,
    read_manifest,
    sha256_file,
    verify,
)

FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    "model.safetensors": bytes(range(256)) * 64,
    "tokenizer.json": b'{"version": "1.0"}',
}


@pytest.fixture
def model_dir(tmp_path):
    directory = tmp_path / "model"
    directory.mkdir()
    for name, content in FILES.items():
        (directory / name).write_bytes(content)
    manifest = {
        "conversion_version": CONVERSION_VERSION,
        "source": "test.gguf",
        "files": {name: hashlib.sha256(content).hexdigest() for name, content in FILES.items()},
    }
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    return directory


def _rewrite_manifest(model_dir, **changes):
    manifest = json.loads((model_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
    manifest.update(changes)
    (model_dir / MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")


def test_sha256_file_matches_hashlib(tmp_path):
    path = tmp_path / "blob"
    content = b"appliance" * 1000
    path.write_bytes(content)
    assert sha256_file(path) == hashlib.sha256(content).hexdigest()


def test_sha256_file_reads_in_chunks(tmp_path):
    path = tmp_path / "blob"
    content = bytes(range(256)) * 10 + b"tail"
    path.write_bytes(content)
    # A chunk size that does not divide the length still covers every byte.
    assert sha256_file(path, chunk_bytes=7) == hashlib.sha256(content).hexdigest()


def test_sha256_of_empty_file(tmp_path):
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert sha256_file(path) == hashlib.sha256(b"").hexdigest()


def test_verify_good_directory_has_no_problems(model_dir):
    assert verify(model_dir) == []


def test_verify_reports_a_changed_byte(model_dir):
    path = model_dir / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[1000] ^= 0x01
    path.write_bytes(bytes(data))
    problems = verify(model_dir)
    assert problems == ["model.safetensors does not match its checksum"]


def test_verify_reports_a_missing_file(model_dir):
    (model_dir / "tokenizer.json").unlink()
    assert verify(model_dir) == ["tokenizer.json is missing"]


def test_verify_reports_every_problem(model_dir):
    (model_dir / "tokenizer.json").unlink()
    (model_dir / "config.json").write_bytes(b"{}")
    problems = verify(model_dir)
    assert sorted(problems) == ["config.json does not match its checksum", "tokenizer.json is missing"]


def test_verify_reports_wrong_conversion_version(model_dir):
    _rewrite_manifest(model_dir, conversion_version=CONVERSION_VERSION + 1)
    problems = verify(model_dir)
    assert len(problems) == 1
    assert "version" in problems[0]


def test_verify_reports_manifest_without_conversion_version(model_dir):
    manifest = json.loads((model_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
    del manifest["conversion_version"]
    (model_dir / MANIFEST_NAME).write_text(json.dumps(manifest), encoding="utf-8")
    assert verify(model_dir) != []


def test_verify_reports_no_manifest(model_dir):
    (model_dir / MANIFEST_NAME).unlink()
    problems = verify(model_dir)
    assert len(problems) == 1
    assert MANIFEST_NAME in problems[0]
    assert "missing" in problems[0]


def test_verify_reports_unreadable_manifest(model_dir):
    (model_dir / MANIFEST_NAME).write_text("{not json", encoding="utf-8")
    assert read_manifest(model_dir) is None
    problems = verify(model_dir)
    assert len(problems) == 1
    assert "unreadable" in problems[0]


def test_verify_reports_manifest_listing_no_files(model_dir):
    _rewrite_manifest(model_dir, files={})
    assert verify(model_dir) == ["the manifest lists no files"]


def test_verify_reports_manifest_that_is_not_an_object(model_dir):
    """A manifest that is valid JSON but not an object (truncated/overwritten by hand) must be
    reported as a problem, so that prepare_default_model converts again, rather than crash."""
    (model_dir / MANIFEST_NAME).write_text("[]", encoding="utf-8")
    problems = verify(model_dir)
    assert len(problems) == 1
    assert "manifest" in problems[0]


def test_verify_ignores_files_not_in_the_manifest(model_dir):
    (model_dir / "README.md").write_text("extra", encoding="utf-8")
    assert verify(model_dir) == []


def test_check_model_dir_accepts_a_directory_with_config(model_dir):
    check_model_dir(model_dir)  # does not raise


def test_check_model_dir_rejects_a_missing_directory(tmp_path):
    with pytest.raises(ModelPreparationError, match="not a directory"):
        check_model_dir(tmp_path / "nowhere")


def test_check_model_dir_rejects_a_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    with pytest.raises(ModelPreparationError, match="not a directory"):
        check_model_dir(path)


def test_check_model_dir_rejects_a_directory_without_config(tmp_path):
    directory = tmp_path / "empty-model"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(ModelPreparationError, match="config.json"):
        check_model_dir(directory)
