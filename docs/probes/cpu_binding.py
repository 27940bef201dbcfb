"""Prompt and decode speed of the served model with its threads bound to some cores or others.

    .venv/bin/python docs/probes/cpu_binding.py [auto 0-1 ...]

Each value of ``VLLM_CPU_OMP_THREADS_BIND`` gets its own uncompiled float32 engine (as the test
suite runs it: 8,192 tokens of context, 2,048 tokens a step, no prefix cache), which reads a
2,000- and a 6,000-token prompt (Debian's GPL-3 text) and decodes 200 tokens for one request and
for four at once. ``auto`` is vLLM's default: the model on every core but the last, which it
keeps for its engine core. The figures behind the test settings binding the model to every core
(README, *The model's cores on a CPU*); one binding per process, since vLLM keeps one engine per process.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cpu_precision import MODEL  # this folder is on the path of a script run from it

TEXT = Path("/usr/share/common-licenses/GPL-3")


def measure() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=MODEL, dtype="float32", enforce_eager=True, max_model_len=8192, max_num_batched_tokens=2048,
        enable_prefix_caching=False,
    )  # fmt: skip
    ids = llm.get_tokenizer()(TEXT.read_text())["input_ids"]
    seconds = {}

    def timed(name, prompts, params):
        started = time.perf_counter()
        llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        seconds[name] = round(time.perf_counter() - started, 2)

    for n in (2000, 6000):
        timed(f"prompt of {n}", [ids[:n]], SamplingParams(max_tokens=1))
    decode = SamplingParams(max_tokens=200, ignore_eos=True)
    timed("200 tokens, 1 request", [ids[:100]], decode)
    timed("200 tokens, 4 requests", [ids[i * 100 : (i + 1) * 100] for i in range(4)], decode)
    print(
        f"VLLM_CPU_OMP_THREADS_BIND={os.environ.get('VLLM_CPU_OMP_THREADS_BIND', 'auto')}: seconds {json.dumps(seconds)}"
    )


if __name__ == "__main__":
    bindings = sys.argv[1:] or ["auto", ",".join(map(str, sorted(os.sched_getaffinity(0))))]
    if len(bindings) == 1:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bindings[0]
        measure()
    else:
        for binding in bindings:  # one engine per process
            subprocess.run([sys.executable, __file__, binding], check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
