"""Test settings: the same module, pointed at the test suite's own embedded services.

The suite runs its own Postgres, Valkey and engine host under ``var/test`` on other ports, so
that `make test` works beside a running `make run` without touching its data.
"""

import os
from pathlib import Path

_BASE_DIR = Path(__file__).resolve().parent.parent
os.environ.setdefault("APPLIANCE_VAR_DIR", str(_BASE_DIR / "var" / "test"))
os.environ.setdefault("APPLIANCE_PG_PORT", "54339")
os.environ.setdefault("APPLIANCE_REDIS_PORT", "63809")
os.environ.setdefault("APPLIANCE_CPU_KV_CACHE_GIB", "2")  # ~44k tokens of this model in float32
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The suite builds an engine five times (first start, two engine-core deaths in one test, one in
# another, a host crash): uncompiled, each takes under a minute instead of about three on this CPU.
# The tests assert what the engine does, not how fast; the benchmarks run the compiled engine.
os.environ.setdefault("APPLIANCE_ENFORCE_EAGER", "1")
# The model's threads on every core, not vLLM's default of all but the last (kept for its engine
# core and, in `make run`, the serving processes): the suite waits on the model, not on those
# processes, and a model on both cores of a 2-core CPU reads prompts ~1.9x and decodes ~1.3x as
# fast (`docs/probes/cpu_binding.py`). `VLLM_CPU_OMP_THREADS_BIND=auto make test` runs the suite
# with vLLM's binding and the appliance's service cores, which `test_cpus.py` then checks live.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, sorted(os.sched_getaffinity(0)))))
# A worker killed by a test is noticed in seconds, not a minute.
os.environ.setdefault("APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S", "8")

from appliance.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests

# Two test sessions on one machine (a developer's and a helper's) each need their own database.
if os.environ.get("APPLIANCE_TEST_DB_NAME"):
    DATABASES["default"]["TEST"] = {"NAME": os.environ["APPLIANCE_TEST_DB_NAME"]}  # noqa: F405
