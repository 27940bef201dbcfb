"""mypy, strict, over the pure modules ([tool.mypy] in pyproject.toml): the decisions of the
appliance are typed, and the list mypy checks is the list the layer test holds pure."""

import subprocess
import sys
import tomllib
from pathlib import Path

from tests.test_layers import PURE

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]


def mypy(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_the_pure_modules_type_check_strictly(tmp_path):
    assert CONFIG["strict"] is True
    result = mypy("--cache-dir", str(tmp_path / "cache"))
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert f"no issues found in {len(CONFIG['files'])} source files" in result.stdout


def test_mypy_checks_exactly_the_modules_held_pure():
    checked = {file.removesuffix(".py").removesuffix("/__init__").replace("/", ".") for file in CONFIG["files"]}
    assert checked == PURE


def test_mypy_would_report_a_wrong_type(tmp_path):
    # The check is about something: a strict mypy fails a str returned as an int.
    (tmp_path / "bad.py").write_text('def f() -> int:\n    return "one"\n', encoding="utf-8")
    result = mypy("--strict", "--cache-dir", str(tmp_path / "cache"), "bad.py", cwd=tmp_path)
    assert result.returncode == 1 and "Incompatible return value type" in result.stdout
