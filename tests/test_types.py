"""mypy ([tool.mypy] in pyproject.toml): the Django packages checked with django-stubs, the pure
modules strictly; and the modules held strict are exactly the ones the layer test holds pure."""

import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

from tests.test_layers import PURE

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
(STRICT,) = [override for override in CONFIG["overrides"] if override.get("disallow_untyped_defs")]


# The whole tree's check takes a minute and a half of one core: ``start_early`` (called by the
# session once it has collected this file's first test) runs it at the lowest CPU priority
# beside the tests before it, most of which leave a core idle, and its test reads the outcome.
_EARLY: dict[str, object] = {}
WHOLE_TREE_TEST = "tests/test_types.py::test_the_appliance_type_checks"


def start_early() -> None:
    cache = tempfile.mkdtemp(prefix="appliance-mypy-")
    _EARLY["cache"] = cache
    _EARLY["process"] = subprocess.Popen(
        ["nice", "-n", "19", sys.executable, "-m", "mypy", "--cache-dir", cache], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def stop_early() -> None:
    """At the session's end: the early run killed if its test never read it, its cache removed."""
    early = _EARLY.pop("process", None)
    if isinstance(early, subprocess.Popen) and early.poll() is None:
        early.kill()
        early.communicate()
    shutil.rmtree(str(_EARLY.pop("cache", "")), ignore_errors=True)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One mypy cache for this file's runs: the second reads what the first already analysed."""
    return str(_EARLY.get("cache") or tmp_path_factory.mktemp("mypy") / "cache")


def mypy(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=cwd, capture_output=True, text=True, timeout=900)


def whole_tree(cache: str) -> subprocess.CompletedProcess:
    """mypy over the tree: the run started early when there is one, else one now."""
    early = _EARLY.get("process")
    if isinstance(early, subprocess.Popen):
        stdout, stderr = early.communicate(timeout=900)  # interrupted, ``stop_early`` kills it
        del _EARLY["process"]
        return subprocess.CompletedProcess(early.args, early.returncode, stdout, stderr)
    return mypy("--cache-dir", cache)


def test_the_appliance_type_checks(cache):
    result = whole_tree(cache)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "Success: no issues found" in result.stdout
    assert "mypy_django_plugin.main" in CONFIG["plugins"]  # querysets and models read with django-stubs


def test_the_strict_modules_are_exactly_the_modules_held_pure():
    assert set(STRICT["module"]) == PURE
    checked = [Path(ROOT, *module.split(".")) for module in PURE]
    listed = [ROOT / entry for entry in CONFIG["files"]]
    for path in checked:  # each pure module is among the files mypy reads
        file = path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py"
        assert any(file == entry or entry in file.parents for entry in listed), f"mypy does not read {file}"


def test_the_strict_override_sets_every_per_module_flag_of_strict():
    flags = {
        "disallow_subclassing_any",
        "disallow_untyped_calls",
        "disallow_untyped_defs",
        "disallow_incomplete_defs",
        "check_untyped_defs",
        "disallow_untyped_decorators",
        "disallow_any_generics",
        "warn_return_any",
        "no_implicit_reexport",
    }
    assert {flag for flag in flags if STRICT.get(flag) is True} == flags


def test_mypy_would_report_an_untyped_function_in_a_pure_module_and_a_wrong_type_anywhere(tmp_path, cache):
    # The check is about something: run on a copy of the tree with one pure module and one Django
    # module spoiled, mypy (this configuration) fails both.
    for entry in ("pyproject.toml", *{entry.split("/")[0] for entry in CONFIG["files"]}):
        source = ROOT / entry
        if source.is_dir():
            subprocess.run(["cp", "-r", str(source), str(tmp_path / entry)], check=True)
        else:
            (tmp_path / entry).write_bytes(source.read_bytes())
    with (tmp_path / "inference" / "timing.py").open("a", encoding="utf-8") as pure:
        pure.write("\n\ndef _untyped(x):\n    return x\n")
    with (tmp_path / "documents" / "selectors.py").open("a", encoding="utf-8") as django_module:
        django_module.write('\n\ndef _wrong() -> int:\n    return "one"\n')
    result = mypy("--cache-dir", cache, cwd=tmp_path)
    assert result.returncode == 1
    assert "inference/timing.py" in result.stdout and "no-untyped-def" in result.stdout
    assert "documents/selectors.py" in result.stdout and "Incompatible return value type" in result.stdout
