"""Prompt and decode speed of the served model in each weight precision, on this machine.

    .venv/bin/python docs/probes/cpu_precision.py [bfloat16 float32 ...]

Each precision gets its own uncompiled vLLM engine (the model is loaded as ``APPLIANCE_MODEL``
or the default converted SmolLM2), reads the same two ~1,800-token prompts (no prefix cache) and
decodes 64 tokens for one request. The figures behind ``APPLIANCE_DTYPE=auto`` choosing float32
on a CPU without bfloat16 arithmetic (README, *Precision on a CPU*); run one precision per
process, since vLLM keeps one engine per process.
"""

import os
import random
import subprocess
import sys
import time
from pathlib import Path

MODEL = os.environ.get("APPLIANCE_MODEL") or str(
    Path(__file__).resolve().parents[2] / "var" / "models" / "SmolLM2-135M-Instruct"
)
WORDS = [
    "the",
    "tenant",
    "shall",
    "pay",
    "rent",
    "on",
    "the",
    "first",
    "day",
    "of",
    "each",
    "month",
    "and",
    "the",
    "landlord",
    "shall",
    "repair",
]


def measure(dtype: str) -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    llm = LLM(model=MODEL, dtype=dtype, enforce_eager=True, max_model_len=4096, enable_prefix_caching=False)
    rng = random.Random(1)  # noqa: S311 - the same prompts for every precision
    rates = []
    for _ in range(2):
        prompt = " ".join(rng.choice(WORDS) for _ in range(1800))
        started = time.perf_counter()
        out = llm.generate([prompt], SamplingParams(max_tokens=1))
        rates.append(len(out[0].prompt_token_ids) / (time.perf_counter() - started))
    started = time.perf_counter()
    llm.generate(["Write a long story about a cat."], SamplingParams(max_tokens=64, ignore_eos=True))
    decode_ms = (time.perf_counter() - started) / 64 * 1000
    print(f"{dtype}: prompt tokens/s {', '.join(f'{r:.1f}' for r in rates)}; decode {decode_ms:.1f} ms/token")


if __name__ == "__main__":
    dtypes = sys.argv[1:] or ["bfloat16", "float32"]
    if len(dtypes) == 1:
        measure(dtypes[0])
    else:
        for dtype in dtypes:  # one engine per process
            subprocess.run([sys.executable, __file__, dtype], check=True)
