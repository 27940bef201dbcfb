"""The tree is as ruff checks and formats it (``make lint``), so CI fails on what review would."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing_to_report():
    result = ruff("check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_the_tree_is_formatted():
    result = ruff("format", "--check", "--no-cache", ".")
    assert result.returncode == 0, "run `ruff format .`:\n" + result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_would_report_a_fault(tmp_path):
    # The check is about something: ruff on this tree's settings fails an unused import.
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "bad.py").write_text("import os\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "bad.py"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 1 and "F401" in result.stdout
