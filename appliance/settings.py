"""Settings for the appliance: one module, driven by the environment.

Every variable is listed in README.md. Defaults are the embedded mode: Postgres and Valkey run
under ``var/`` on loopback ports, the model is the small one converted under ``var/models/``.
Production sets ``DATABASE_URL``, ``REDIS_URL``, ``APPLIANCE_SECRET_KEY`` and ``APPLIANCE_MODEL``.
"""

from __future__ import annotations

import socket
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from appliance.credentials import EmbeddedCredentials, generated_secret
from appliance.env import EnvError, env_bool, env_choice, env_cpus, env_float, env_int, env_list, env_str
from appliance.sizing import ingest_threads, this_machine

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("APPLIANCE_VAR_DIR") or BASE_DIR / "var").resolve()

DEBUG = env_bool("APPLIANCE_DEBUG", False)


def _secret_key() -> str:
    """The configured key, or (embedded mode only) one generated once and kept under var/."""
    configured = env_str("APPLIANCE_SECRET_KEY")
    if configured:
        return configured
    older = VAR_DIR / "secret_key"  # where versions before var/secrets/ kept it: sessions survive
    if older.exists():
        return older.read_text(encoding="utf-8").strip()
    return generated_secret(VAR_DIR, "secret_key", nbytes=50)  # 67 characters: Django's check wants 50


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("APPLIANCE_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("APPLIANCE_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "appliance",
    "documents",
    "inference",
    "console",
    "api",
    "directory",  # sign-in with the organisation's directory: LDAP / Active Directory, OpenID Connect
    "measure",  # benchmarks, the spec sheet run and the evaluation (manage.py bench, specsheet, evaluate)
    "ninja",  # its Swagger UI files, served from here: the API docs need no CDN
]

# Django's own, each without a thread hop where it needs none (appliance/middleware.py).
MIDDLEWARE = [
    "appliance.middleware.SecurityMiddleware",
    "appliance.csp.content_security_policy",
    "api.middleware.method_not_allowed_as_problem",
    "appliance.middleware.StaticFiles",
    "appliance.middleware.SessionMiddleware",
    "appliance.middleware.CommonMiddleware",
    "appliance.middleware.CsrfViewMiddleware",
    "appliance.middleware.AuthenticationMiddleware",
    "appliance.middleware.MessageMiddleware",
    "appliance.middleware.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "appliance.urls"
ASGI_APPLICATION = "appliance.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------

EMBEDDED_PG_PORT = env_int("APPLIANCE_PG_PORT", 54329, minimum=1, maximum=65535)
EMBEDDED_REDIS_PORT = env_int("APPLIANCE_REDIS_PORT", 63799, minimum=1, maximum=65535)


def _embedded_credentials():
    """The embedded services' passwords (appliance/credentials.py), generated under var/secrets/
    on first use; not made at all when both services are configured by URL."""
    if env_str("DATABASE_URL") and env_str("REDIS_URL"):
        return None
    return EmbeddedCredentials.of(VAR_DIR)


_EMBEDDED = _embedded_credentials()
_PG_LOGIN = f"appliance:{quote(_EMBEDDED.postgres_appliance, safe='')}" if _EMBEDDED else "appliance"
EMBEDDED_DATABASE_URL = f"postgresql://{_PG_LOGIN}@127.0.0.1:{EMBEDDED_PG_PORT}/appliance"


def _database_from_url(url: str) -> dict:
    parts = urlsplit(url)
    pool = _pool_options()
    if parts.scheme not in {"postgres", "postgresql"}:
        raise EnvError(f"DATABASE_URL must be a postgresql:// URL, not {parts.scheme}://")
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise EnvError("DATABASE_URL names no database")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        # Connections come from a pool per process (appliance/database.py): a job never waits for a
        # new backend; on a 2-core box busy with the engine, starting one (fork and SCRAM) now and
        # then took more than 10 s and a drafter waited that long for its turn. The pool checks
        # each connection before handing it out (with a pool, that is what health checks mean).
        "CONN_MAX_AGE": 0,
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": {"connect_timeout": 10, **pool},
        "TEST": {"NAME": env_str("APPLIANCE_TEST_DATABASE_NAME")},
    }


def _pool_options() -> dict:
    """At most ``APPLIANCE_DB_POOL_MAX_SIZE`` connections in a process's pool: a cap on what its
    threads would open anyway (a job holds one, its heartbeat another for a moment; an open event
    stream one), not a reservation. The pool opens what is asked for and, once a minute, closes
    one that went unused, down to two. 0: no pool, a new connection per request and per job (behind a
    transaction-mode PgBouncer). A connection that cannot be had within
    ``APPLIANCE_DB_POOL_TIMEOUT_S`` is an error, as a connect timeout was; the pool's own retries
    give up as soon, so that a database that comes back is used by the next request."""
    max_size = env_int("APPLIANCE_DB_POOL_MAX_SIZE", 64, minimum=0)
    if max_size == 0:
        return {}
    timeout_s = env_float("APPLIANCE_DB_POOL_TIMEOUT_S", 10.0, minimum=0.5)
    return {
        "pool": {
            "min_size": min(2, max_size),
            "max_size": max_size,
            "timeout": timeout_s,
            "reconnect_timeout": timeout_s,
            "max_idle": 60.0,
            "name": "appliance",
        }
    }


DATABASE_URL = env_str("DATABASE_URL") or EMBEDDED_DATABASE_URL
DATABASES = {"default": _database_from_url(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Broker ---------------------------------------------------------------------------------

_REDIS_LOGIN = f":{quote(_EMBEDDED.valkey, safe='')}@" if _EMBEDDED else ""
EMBEDDED_REDIS_URL = f"redis://{_REDIS_LOGIN}127.0.0.1:{EMBEDDED_REDIS_PORT}/0"
REDIS_URL = env_str("REDIS_URL") or EMBEDDED_REDIS_URL

# The longest job the appliance runs, in seconds: each attempt's deadline, enforced by the worker
# itself on every pool (inference/attempts.py), with Celery's limits 30 and 60 s later for pools
# that honour them. The broker's visibility timeout must be above it.
APPLIANCE_JOB_TIME_LIMIT_S = env_int("APPLIANCE_JOB_TIME_LIMIT_S", 1800, minimum=10)

CELERY_BROKER_URL = REDIS_URL
# documents.tasks.INGEST_TIME_LIMIT_S: an hour, plus a minute for the hard limit.
_INGEST_TIME_LIMIT_S = 3660
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # Above the longest task, or a task still running would be handed to a second worker.
    "visibility_timeout": max(APPLIANCE_JOB_TIME_LIMIT_S + 60, _INGEST_TIME_LIMIT_S) + 600,
    "socket_connect_timeout": 5,
    # A publish to a broker that vanished without closing the connection fails instead of
    # waiting for ever (consumers poll with BRPOP every second, well inside it).
    "socket_timeout": 10,
}
# A web request that creates a job waits at most a few seconds for a broker that is down, then
# answers 503 (appliance/broker.py); kombu's default retries would hold it longer.
CELERY_BROKER_CONNECTION_TIMEOUT = 2
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.25, "interval_max": 0.5}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "ingest"
CELERY_TASK_ROUTES = {
    "documents.tasks.*": {"queue": "ingest"},
    "directory.tasks.*": {"queue": "ingest"},
    # inference.tasks.run_job is sent to the job's own queue (prefill or decode) when enqueued.
}
CELERY_WORKER_SEND_TASK_EVENTS = False
CELERY_TASK_ALWAYS_EAGER = False

# Worker pools: one per queue, each with its own concurrency cap. The ingest's is threads reading
# documents side by side (0: sized from the machine, appliance.sizing.ingest_threads).
APPLIANCE_INGEST_CONCURRENCY = env_int("APPLIANCE_INGEST_CONCURRENCY", 0, minimum=0)
# The ingest worker's CPU priority below the other processes (nice); 0: the same.
APPLIANCE_INGEST_NICE = env_int("APPLIANCE_INGEST_NICE", 10, minimum=0, maximum=19)
# Its CPU class. "idle-embedding" (the default): the embedding alone (93 % of the ingest's work,
# the batcher's thread) in Linux's SCHED_IDLE: almost no CPU while any normal process wants it.
# "idle-while-drafting": the embedding (each batch on a thread of its own) in SCHED_IDLE while
# this machine's engine runs drafting requests or did within the last minute
# (documents.embeddings.DRAFTING_HOLD_S), at the niceness below otherwise. "nice": the niceness
# only. "idle": the whole worker and its extraction children in SCHED_IDLE. Measured on 2 cores,
# drafting TTFT p95 beside a backlog, pooled: 1.77x alone with "nice", 1.04x with
# "idle-embedding", 1.07x with "idle" (2026-12-05); on 2026-12-06, back to back,
# "idle-embedding" 1.03x [0.87, 1.46] and "idle-while-drafting" 2.35x [1.55, 3.04], so the
# latter is not the default although, with nobody drafting, it leaves the ingest the whole of a
# free core (an idle-class thread waits for every other runnable thread of the box, a shared
# machine's included). "idle" is not the default: an engine that keeps every core busy for long
# starves it, and its wall-clock limits (an extraction's 120 s) then fail good files; the row
# locks its open transactions hold wait for it too. The embedding threads hold no connection and
# no row lock (the worker's other threads wait for them only while they hold Python's
# interpreter lock); a document waiting for them counts the wait in its ingest's hour
# (documents.tasks.INGEST_TIME_LIMIT_S), which a busy engine must starve it for nearly all of.
APPLIANCE_INGEST_CPU_CLASS = env_choice(
    "APPLIANCE_INGEST_CPU_CLASS",
    "idle-embedding",
    ("nice", "idle-embedding", "idle-while-drafting", "idle"),
)
# Where the web server, the decode and prefill workers, Postgres and Valkey run: "auto" on the
# cores vLLM's CPU build reserves beside its model (the model's own cores are then the model's
# alone), "off" anywhere, or a list ("3", "2-3,6"). appliance/cpus.py.
APPLIANCE_SERVICE_CPUS = env_cpus("APPLIANCE_SERVICE_CPUS", "auto")
APPLIANCE_PREFILL_CONCURRENCY = env_int("APPLIANCE_PREFILL_CONCURRENCY", 2, minimum=1)
APPLIANCE_DECODE_CONCURRENCY = env_int("APPLIANCE_DECODE_CONCURRENCY", 8, minimum=1)
# A /v1 request the decode queue would start at once is run by the web process itself on this
# node's engine (when that engine is the only one of the decode queue), its tokens relayed from
# the engine host's socket rather than through a worker and the broker's stream. Off: every
# /v1 request goes through a worker, as every other job does.
APPLIANCE_V1_IN_WEB = env_bool("APPLIANCE_V1_IN_WEB", True)

# The address the web server listens on (its port: APPLIANCE_PORT). The loopback address behind a
# reverse proxy on the same box; 0.0.0.0 in a container, where the proxy (an ingress) is elsewhere.
APPLIANCE_WEB_HOST = env_str("APPLIANCE_WEB_HOST") or "127.0.0.1"

# How long token deltas of a job stay replayable for a reconnecting browser.
APPLIANCE_STREAM_RETENTION_S = env_int("APPLIANCE_STREAM_RETENTION_S", 3600, minimum=60)

# --- Engine ---------------------------------------------------------------------------------

# Converted models live outside VAR_DIR's per-instance data so that the test suite (which has its
# own VAR_DIR) reuses the conversion that `make run` made, and vice versa.
MODELS_DIR = Path(env_str("APPLIANCE_MODELS_DIR") or BASE_DIR / "var" / "models").resolve()
DEFAULT_MODEL_DIR = MODELS_DIR / "SmolLM2-135M-Instruct"
APPLIANCE_MODEL = Path(env_str("APPLIANCE_MODEL") or DEFAULT_MODEL_DIR)
APPLIANCE_MODEL_LICENCE = env_str("APPLIANCE_MODEL_LICENCE") or (
    "Apache-2.0" if APPLIANCE_MODEL == DEFAULT_MODEL_DIR else "unknown (set APPLIANCE_MODEL_LICENCE)"
)
APPLIANCE_ENGINE_SOCKET = Path(env_str("APPLIANCE_ENGINE_SOCKET") or VAR_DIR / "run" / "engine.sock")
# The weights' precision. "auto": the model's own (bfloat16 for most), except on a CPU without
# bfloat16 arithmetic (no AVX-512 BF16 or AMX), where it is float32: ~4x faster prefill there
# (inference/engine/host.py, cpu_weight_dtype). The KV cache's "auto" follows the weights.
APPLIANCE_DTYPE = env_choice("APPLIANCE_DTYPE", "auto", ("auto", "bfloat16", "float16", "float32"))
APPLIANCE_KV_CACHE_DTYPE = env_choice("APPLIANCE_KV_CACHE_DTYPE", "auto", ("auto", "fp8", "fp8_e4m3", "fp8_e5m2"))
APPLIANCE_MAX_MODEL_LEN = env_int("APPLIANCE_MAX_MODEL_LEN", 8192, minimum=256)
# Most requests the engine runs at once; 0: 32 on a CPU, and on a GPU what the capacity planner
# finds room for (inference/capacity.py, gpu_engine_defaults).
APPLIANCE_MAX_NUM_SEQS = env_int("APPLIANCE_MAX_NUM_SEQS", 0, minimum=0) or None
APPLIANCE_MAX_NUM_BATCHED_TOKENS = env_int("APPLIANCE_MAX_NUM_BATCHED_TOKENS", 2048, minimum=64)
# vLLM's cap on prompt tokens one request may prefill per step while others run (0: off). The
# appliance's scheduler already sizes document chunks; this would bound long drafting prompts.
APPLIANCE_LONG_PREFILL_TOKEN_THRESHOLD = env_int("APPLIANCE_LONG_PREFILL_TOKEN_THRESHOLD", 0, minimum=0)
# Share of the GPU's memory vLLM takes; 0: all but what the runtime needs beside it (the planner).
APPLIANCE_GPU_MEMORY_UTILIZATION = env_float("APPLIANCE_GPU_MEMORY_UTILIZATION", 0.0, minimum=0.0, maximum=0.99) or None
# CPU build only: the KV cache size in GiB (vLLM's VLLM_CPU_KVCACHE_SPACE).
APPLIANCE_CPU_KV_CACHE_GIB = env_int("APPLIANCE_CPU_KV_CACHE_GIB", 2, minimum=1)
# Run the model without compiling it (vLLM's enforce_eager: no torch.compile, no CUDA graphs).
# The engine starts in well under a minute instead of about three on this CPU, and decodes about
# 15 % slower; on a GPU, far slower. The test suite, which builds an engine five times, runs eager.
APPLIANCE_ENFORCE_EAGER = env_bool("APPLIANCE_ENFORCE_EAGER", False)
# Every request to the engine host carries this token (the socket is owner-only as well); in the
# embedded default it is generated under var/secrets/. Benchmark operations (switching the
# scheduling policy, emptying the prefix cache, running requests past admission) are served
# only by a host started with APPLIANCE_ENGINE_BENCHMARK_OPS (the benchmarks start their own).
APPLIANCE_ENGINE_TOKEN = env_str("APPLIANCE_ENGINE_TOKEN") or generated_secret(VAR_DIR, "engine_token")
APPLIANCE_ENGINE_BENCHMARK_OPS = env_bool("APPLIANCE_ENGINE_BENCHMARK_OPS", False)
APPLIANCE_ENGINE_CONNECT_TIMEOUT_S = env_float("APPLIANCE_ENGINE_CONNECT_TIMEOUT_S", 5.0, minimum=0.1)
# Engine hosts on this node: one per GPU, or per group of APPLIANCE_TENSOR_PARALLEL_SIZE GPUs
# (vLLM's tensor parallelism: a model too large for one GPU), each with its own prefill and
# decode workers. The GPUs, in order: APPLIANCE_ENGINE_GPUS (CUDA device numbers; default 0, 1, ...).
APPLIANCE_ENGINES = env_int("APPLIANCE_ENGINES", 1, minimum=1, maximum=64)
APPLIANCE_TENSOR_PARALLEL_SIZE = env_int("APPLIANCE_TENSOR_PARALLEL_SIZE", 1, minimum=1, maximum=64)
APPLIANCE_ENGINE_GPUS = env_list("APPLIANCE_ENGINE_GPUS", [])
# This node in the cluster view (/healthz, /metrics, the console): its name, how often
# `manage.py serve` announces it in the broker, and how long without a report before it is down.
APPLIANCE_NODE_NAME = env_str("APPLIANCE_NODE_NAME") or socket.gethostname()
APPLIANCE_NODE_HEARTBEAT_S = env_float("APPLIANCE_NODE_HEARTBEAT_S", 5.0, minimum=0.5)
APPLIANCE_NODE_DOWN_AFTER_S = env_float("APPLIANCE_NODE_DOWN_AFTER_S", 20.0, minimum=1.0)
# Placement across several engines (inference/placement.py): a document's jobs wait up to this
# long for the engine that ran its last job (which holds its prompt in its prefix cache) while
# that engine has room, and that engine is remembered this long.
APPLIANCE_PLACEMENT_WAIT_S = env_float("APPLIANCE_PLACEMENT_WAIT_S", 30.0, minimum=0.0)
APPLIANCE_PLACEMENT_AFFINITY_TTL_S = env_int("APPLIANCE_PLACEMENT_AFFINITY_TTL_S", 3600, minimum=1)
# Nodes without an engine of their own (or with several) reach one by URL: tls://host:port (the
# host's certificate checked against APPLIANCE_ENGINE_TLS_CA), tcp://127.0.0.1:port, or
# unix:/path. Empty: this node's engine host, at APPLIANCE_ENGINE_SOCKET.
APPLIANCE_ENGINE_URL = env_str("APPLIANCE_ENGINE_URL") or ""
# The engine host also listens on TCP at host:port (empty: its Unix socket only), with TLS when
# a certificate and key (PEM files) are given; plain TCP only on the loopback address.
APPLIANCE_ENGINE_LISTEN = env_str("APPLIANCE_ENGINE_LISTEN") or ""
APPLIANCE_ENGINE_TLS_CERT = env_str("APPLIANCE_ENGINE_TLS_CERT") or ""
APPLIANCE_ENGINE_TLS_KEY = env_str("APPLIANCE_ENGINE_TLS_KEY") or ""
# The CA that signed the engine hosts' certificates (PEM), for clients of a tls:// engine; empty:
# the system's trusted CAs.
APPLIANCE_ENGINE_TLS_CA = env_str("APPLIANCE_ENGINE_TLS_CA") or ""


def _check_engine_addresses() -> None:
    from inference.engine.address import AddressError, EngineAddress, check_client, check_listen, parse_host_port

    try:
        if APPLIANCE_ENGINE_URL:
            check_client(EngineAddress.parse(APPLIANCE_ENGINE_URL))
        if bool(APPLIANCE_ENGINE_TLS_CERT) != bool(APPLIANCE_ENGINE_TLS_KEY):
            raise AddressError("set both APPLIANCE_ENGINE_TLS_CERT and APPLIANCE_ENGINE_TLS_KEY, or neither")
        if APPLIANCE_ENGINE_LISTEN:
            host, _ = parse_host_port(APPLIANCE_ENGINE_LISTEN, what="APPLIANCE_ENGINE_LISTEN")
            check_listen(host, tls=bool(APPLIANCE_ENGINE_TLS_CERT), token=APPLIANCE_ENGINE_TOKEN)
    except AddressError as exc:
        raise EnvError(str(exc)) from None


_check_engine_addresses()
# KV cache block size in tokens; 0 keeps vLLM's default for the device (128 on a CPU, 16 on a GPU).
APPLIANCE_KV_BLOCK_SIZE = env_int("APPLIANCE_KV_BLOCK_SIZE", 0, minimum=0) or None
# Use at most this many tokens of KV cache (0: all that vLLM finds room for). For sharing a
# device, and for `bench scheduling`'s peak on a CPU, where filling gigabytes takes hours.
APPLIANCE_KV_CAPACITY_TOKENS = env_int("APPLIANCE_KV_CAPACITY_TOKENS", 0, minimum=0) or None

# --- Scheduling (inference/engine/step_policy.py, vllm_scheduler.py) ------------------------

# appliance: the appliance's scheduler inside vLLM (drafting first, documents in what is left of
# each step, KV admission by blocks). engine: vLLM's priority scheduling alone. fifo: one queue,
# arrival order, one priority. The last two are baselines for `bench scheduling`.
APPLIANCE_SCHEDULING = env_choice("APPLIANCE_SCHEDULING", "appliance", ("appliance", "engine", "fifo"))
# What a request reserves of the KV cache when it enters the engine: its prompt and its max
# output ("max": never preempted), or its prompt and the output its kind usually writes
# ("predicted": the 90th percentile of recent ones; vLLM's preemption is the safety net).
APPLIANCE_KV_RESERVATION = env_choice("APPLIANCE_KV_RESERVATION", "max", ("max", "predicted"))
# Share of the KV blocks reservations may fill, and the part of that only drafting may use (so
# that a drafter can always start).
APPLIANCE_KV_SAFETY_FACTOR = env_float("APPLIANCE_KV_SAFETY_FACTOR", 0.95, minimum=0.1, maximum=1.0)
APPLIANCE_KV_DECODE_RESERVE = env_float("APPLIANCE_KV_DECODE_RESERVE", 0.1, minimum=0.0, maximum=0.9)
# While drafting runs, a step may hold document prefill chunks as long as it then takes at most
# this many times as long as the same step without them (drafters' inter-token latency), as the
# scheduler's step-cost model (fitted on this machine) predicts. Or, when set, an absolute
# inter-token latency target in milliseconds instead.
APPLIANCE_DRAFTING_ITL_SLOWDOWN = env_float("APPLIANCE_DRAFTING_ITL_SLOWDOWN", 1.4, minimum=1.0, maximum=10.0)
APPLIANCE_DRAFTING_ITL_TARGET_MS = env_float("APPLIANCE_DRAFTING_ITL_TARGET_MS", 0.0, minimum=0.0)
# With nobody drafting, documents may lose this share of their prefill speed to steps shorter
# than the whole budget (a step's fixed cost, paid more often), so that a drafter who arrives
# waits for a short step: on a GPU that is about the whole budget, on a CPU a fraction. 0: the
# whole budget always.
APPLIANCE_IDLE_THROUGHPUT_LOSS = env_float("APPLIANCE_IDLE_THROUGHPUT_LOSS", 0.02, minimum=0.0, maximum=0.4)
# For this many seconds after a drafting request was last in the engine, a step of documents
# alone is no longer than the gap step (or a drafter's first step, if longer), so that one
# arriving in a gap between drafters waits little (0: off; then only
# APPLIANCE_IDLE_THROUGHPUT_LOSS bounds such a step). The gap step: APPLIANCE_DRAFTING_GAP_STEP_MS
# when set, else (0) what keeps such a drafter's TTFT within APPLIANCE_DRAFTING_TTFT_SLOWDOWN of
# one arriving beside drafting alone, from the step costs (step_policy.Planner.gap_step_s).
APPLIANCE_DRAFTING_RECENT_S = env_float("APPLIANCE_DRAFTING_RECENT_S", 30.0, minimum=0.0)
APPLIANCE_DRAFTING_GAP_STEP_MS = env_float("APPLIANCE_DRAFTING_GAP_STEP_MS", 0.0, minimum=0.0)
APPLIANCE_DRAFTING_TTFT_SLOWDOWN = env_float("APPLIANCE_DRAFTING_TTFT_SLOWDOWN", 2.0, minimum=1.0, maximum=10.0)
# A backlog that arrives at an empty engine starts with steps as short as a drafter's first one,
# each documents-only step then this many times the one before, up to the size above (a slow
# start: a drafter arriving t seconds after the engine got busy waits for a step of about t at
# most). 0: off.
APPLIANCE_IDLE_RAMP_FACTOR = env_float("APPLIANCE_IDLE_RAMP_FACTOR", 2.0, minimum=0.0, maximum=64.0)
if 0.0 < APPLIANCE_IDLE_RAMP_FACTOR <= 1.0:
    raise EnvError(f"APPLIANCE_IDLE_RAMP_FACTOR={APPLIANCE_IDLE_RAMP_FACTOR} must be 0 (off) or above 1")
# Beside drafting, documents save up each step's spare time and spend it in one chunk when what
# holding any prefill costs a step is more than this share of that spare time (a CPU); 0: never.
APPLIANCE_CHUNK_FIXED_COST_SHARE = env_float("APPLIANCE_CHUNK_FIXED_COST_SHARE", 0.5, minimum=0.0, maximum=0.99)
# While documents wait for prefill, their share of the engine's time is kept at least this when
# drafting fills the engine (an overloaded office); 0: drafting may starve documents.
APPLIANCE_DOCUMENT_MIN_SHARE = env_float("APPLIANCE_DOCUMENT_MIN_SHARE", 0.2, minimum=0.0, maximum=0.5)
# Past this many waiting jobs in a queue, new jobs are refused with 429 and Retry-After.
APPLIANCE_MAX_QUEUE_DEPTH = env_int("APPLIANCE_MAX_QUEUE_DEPTH", 1000, minimum=1)
# Past this many waiting jobs of one person in a queue, that person's new jobs are refused with
# 429 (well under the depth above, so that one person cannot fill a queue). 0: no such limit.
APPLIANCE_MAX_QUEUED_PER_USER = env_int("APPLIANCE_MAX_QUEUED_PER_USER", 100, minimum=0)
# A running job whose worker has not reported for this long is handed to another worker.
APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S = env_int("APPLIANCE_JOB_HEARTBEAT_TIMEOUT_S", 60, minimum=2)
# How long a job keeps retrying while the engine host is down (it restarts in about 2 minutes).
APPLIANCE_ENGINE_RETRY_WINDOW_S = env_int("APPLIANCE_ENGINE_RETRY_WINDOW_S", 600, minimum=0)
# When set, GET /metrics needs "Authorization: Bearer <token>".
APPLIANCE_METRICS_TOKEN = env_str("APPLIANCE_METRICS_TOKEN")

# Summaries: how many tokens the model may write, and how much of the context a document may
# fill (the rest is the instruction and the answer).
APPLIANCE_SUMMARY_MAX_TOKENS = env_int("APPLIANCE_SUMMARY_MAX_TOKENS", 256, minimum=16)
# Summaries and drafted replies (free text the appliance asks for; not chat, not guided JSON):
# small models fall into loops of one sentence under greedy decoding. It counts the output's own
# tokens only, so copying names and figures from the document costs nothing. 0 turns it off.
APPLIANCE_FREQUENCY_PENALTY = env_float("APPLIANCE_FREQUENCY_PENALTY", 0.3, minimum=0.0, maximum=2.0)

# --- Documents ------------------------------------------------------------------------------

MEDIA_ROOT = VAR_DIR / "media"
APPLIANCE_MAX_UPLOAD_MB = env_int("APPLIANCE_MAX_UPLOAD_MB", 100, minimum=1)
# Limits per person, so that one person cannot fill the disk, the ingest queue or the web
# server's connections for everyone (0: no limit): stored bytes (attachments included), documents
# waiting to be read, and streams open at once (job pages, streamed chat completions).
APPLIANCE_MAX_STORAGE_MB_PER_USER = env_int("APPLIANCE_MAX_STORAGE_MB_PER_USER", 20480, minimum=0)
APPLIANCE_MAX_INGESTING_PER_USER = env_int("APPLIANCE_MAX_INGESTING_PER_USER", 500, minimum=0)
APPLIANCE_MAX_STREAMS_PER_USER = env_int("APPLIANCE_MAX_STREAMS_PER_USER", 8, minimum=0)
# E-mail attachments become documents: nested at most this deep (an e-mail's own are level 1),
# and at most this many under one upload in all.
APPLIANCE_MAX_ATTACHMENT_DEPTH = env_int("APPLIANCE_MAX_ATTACHMENT_DEPTH", 3, minimum=0)
APPLIANCE_MAX_ATTACHMENTS_PER_UPLOAD = env_int("APPLIANCE_MAX_ATTACHMENTS_PER_UPLOAD", 200, minimum=0)
# A zip uploaded as a batch: at most this many files, unpacking to at most this many MB in all
# (the zip itself and each of its files within APPLIANCE_MAX_UPLOAD_MB, none compressed more
# than 100 times); anything else in it is listed as skipped, with the reason.
APPLIANCE_BATCH_ZIP_MAX_FILES = env_int("APPLIANCE_BATCH_ZIP_MAX_FILES", 1000, minimum=1)
APPLIANCE_BATCH_ZIP_MAX_UNPACKED_MB = env_int("APPLIANCE_BATCH_ZIP_MAX_UNPACKED_MB", 2048, minimum=1)
# Sources (watched folders, IMAP mailboxes; configured in the admin console): Celery beat looks
# for sources due a poll every APPLIANCE_SOURCE_TICK_S (0: sources are never polled). A poll
# takes at most this many new or changed files or messages (the rest at the next poll), leaves a
# file modified in the last APPLIANCE_SOURCE_SETTLE_S for the next (it may still be being
# copied), and gives up on a mail server that does not answer in APPLIANCE_SOURCE_IMAP_TIMEOUT_S.
APPLIANCE_SOURCE_TICK_S = env_int("APPLIANCE_SOURCE_TICK_S", 60, minimum=0)
APPLIANCE_SOURCE_MAX_ITEMS_PER_POLL = env_int("APPLIANCE_SOURCE_MAX_ITEMS_PER_POLL", 200, minimum=1)
APPLIANCE_SOURCE_SETTLE_S = env_int("APPLIANCE_SOURCE_SETTLE_S", 30, minimum=0)
APPLIANCE_SOURCE_IMAP_TIMEOUT_S = env_float("APPLIANCE_SOURCE_IMAP_TIMEOUT_S", 30.0, minimum=1.0)
# --- API ------------------------------------------------------------------------------------
# Requests per minute of one person's API tokens together (a token given a limit of its own: counted alone).
APPLIANCE_API_RATE_LIMIT_PER_MINUTE = env_int("APPLIANCE_API_RATE_LIMIT_PER_MINUTE", 300, minimum=1)
# API calls a browser session signs, per user (the pages' own scripts make a few a minute).
APPLIANCE_SESSION_API_RATE_LIMIT_PER_MINUTE = env_int("APPLIANCE_SESSION_API_RATE_LIMIT_PER_MINUTE", 300, minimum=1)

APPLIANCE_MAX_PAGES = env_int("APPLIANCE_MAX_PAGES", 5000, minimum=1)
# Each file is parsed in a child process with these limits, so a hostile file fails alone.
APPLIANCE_EXTRACTION_TIMEOUT_S = env_int("APPLIANCE_EXTRACTION_TIMEOUT_S", 300, minimum=5)
APPLIANCE_EXTRACTION_MEMORY_MB = env_int("APPLIANCE_EXTRACTION_MEMORY_MB", 2048, minimum=256)
if not APPLIANCE_INGEST_CONCURRENCY:
    _cores, _memory = this_machine()
    APPLIANCE_INGEST_CONCURRENCY = ingest_threads(
        cores=_cores, memory_bytes=_memory, extraction_memory_bytes=APPLIANCE_EXTRACTION_MEMORY_MB * 1024 * 1024
    )
# OCR of image-only PDF pages, when Tesseract is installed (Debian: tesseract-ocr, poppler-utils).
APPLIANCE_OCR = env_bool("APPLIANCE_OCR", True)
# Embeddings: a sentence-transformers model directory; default all-MiniLM-L6-v2 from its wheel.
APPLIANCE_EMBEDDING_MODEL = env_str("APPLIANCE_EMBEDDING_MODEL")
# Threads the embedding model may use in each process that embeds (the ingest worker, a summary's
# and a draft's checks, search). 0: one where the engine runs on this machine's CPU (vLLM binds its
# model to the other cores and leaves one for everything else: a second thread would take a core
# from the engine's steps), the torch default where it has a GPU.
APPLIANCE_EMBEDDING_THREADS = env_int("APPLIANCE_EMBEDDING_THREADS", 0, minimum=0, maximum=256)
APPLIANCE_EMBEDDING_BATCH = env_int("APPLIANCE_EMBEDDING_BATCH", 64, minimum=1)
# Where the ingest embeds: "cpu", or "cuda" (the GPU beside vLLM, on a node that runs both the
# ingest and an engine: APPLIANCE_EMBEDDING_GPU_MEMORY_MB of the GPU is then left out of vLLM's
# share). Search and a job's checks embed a sentence or two and stay on the CPU.
APPLIANCE_EMBEDDING_DEVICE = env_choice("APPLIANCE_EMBEDDING_DEVICE", "cpu", ("cpu", "cuda"))
APPLIANCE_EMBEDDING_GPU_MEMORY_MB = env_int("APPLIANCE_EMBEDDING_GPU_MEMORY_MB", 1024, minimum=0)
# While the engine of this machine runs drafting requests on the embedder's device, the ingest
# embeds this share of the time and rests the rest (documents/embedding_batcher.py); 1 (the
# default): never rests. Off by default: on a 2-core CPU, 0.1 cut the ingest to a tenth while
# drafting ran and drafting's TTFT and ITL did not measurably gain (README, Documents).
APPLIANCE_INGEST_SHARE_WHILE_DRAFTING = env_float(
    "APPLIANCE_INGEST_SHARE_WHILE_DRAFTING", 1.0, minimum=0.01, maximum=1.0
)
# all-MiniLM-L6-v2 reads 254 tokens of text; the overlap costs its share of embedding time again.
APPLIANCE_CHUNK_TOKENS = env_int("APPLIANCE_CHUNK_TOKENS", 224, minimum=16, maximum=510)
APPLIANCE_CHUNK_OVERLAP_TOKENS = env_int("APPLIANCE_CHUNK_OVERLAP_TOKENS", 24, minimum=0)
# Search: HNSW breadth (recall against speed), candidates per arm before rank fusion, and the
# size under which a user's readable chunks are compared exactly instead of through the index.
APPLIANCE_SEARCH_EF_SEARCH = env_int("APPLIANCE_SEARCH_EF_SEARCH", 200, minimum=10, maximum=1000)
APPLIANCE_SEARCH_CANDIDATES = env_int("APPLIANCE_SEARCH_CANDIDATES", 50, minimum=10, maximum=1000)
APPLIANCE_SEARCH_EXACT_MAX_CHUNKS = env_int("APPLIANCE_SEARCH_EXACT_MAX_CHUNKS", 10000, minimum=0)
# Rerank search's candidates by clause titles and terms (documents.rerank). Off: on CUAD-dev it
# finds a little more, on the reply gold set less (`evaluate --tasks retrieval` prints both).
APPLIANCE_SEARCH_RERANK = env_bool("APPLIANCE_SEARCH_RERANK", False)
DATA_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = 5 * 1024 * 1024

# --- Web ------------------------------------------------------------------------------------

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "login"
# Sign-in is refused for APPLIANCE_LOGIN_LOCKOUT_S after this many failures for one user name, or
# from one client address, within that time (429 with Retry-After; counted in the broker).
APPLIANCE_LOGIN_FAILURES_PER_USER = env_int("APPLIANCE_LOGIN_FAILURES_PER_USER", 5, minimum=1)
APPLIANCE_LOGIN_FAILURES_PER_ADDRESS = env_int("APPLIANCE_LOGIN_FAILURES_PER_ADDRESS", 20, minimum=1)
APPLIANCE_LOGIN_LOCKOUT_S = env_int("APPLIANCE_LOGIN_LOCKOUT_S", 900, minimum=1)
# Every password set here (the admin's forms, APPLIANCE_ADMIN_PASSWORD) is checked: at least 12
# characters, not a common one, not all digits, not close to the user's name or e-mail.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# --- Directory sign-in (directory/; README, *Sign-in*) -------------------------------------
# Local accounts (Django's own, the embedded administrator, a break-glass account) always sign in
# first; then the directory's. Each method is on when its first setting is set.
from directory.mapping import parse_group_list, parse_group_map  # noqa: E402 (pure: no Django)

AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend"]

# LDAP / Active Directory: search as the service account, then bind as the account found.
# Several URLs (comma-separated) are tried in turn. ldaps:// or StartTLS verify the server's
# certificate against APPLIANCE_LDAP_CA_FILE (or the system's CAs).
APPLIANCE_LDAP_URLS = env_list("APPLIANCE_LDAP_URL", [])
APPLIANCE_LDAP_BIND_DN = env_str("APPLIANCE_LDAP_BIND_DN") or ""
APPLIANCE_LDAP_BIND_PASSWORD = env_str("APPLIANCE_LDAP_BIND_PASSWORD") or ""  # or _FILE
APPLIANCE_LDAP_START_TLS = env_bool("APPLIANCE_LDAP_START_TLS", False)
APPLIANCE_LDAP_CA_FILE = env_str("APPLIANCE_LDAP_CA_FILE")
APPLIANCE_LDAP_USER_SEARCH_BASE = env_str("APPLIANCE_LDAP_USER_SEARCH_BASE") or ""
# Who may sign in: accounts under the base matching this filter (a disabled account left out by
# it cannot sign in, and the sync deactivates it); the user name is matched in the attribute below.
APPLIANCE_LDAP_USER_FILTER = env_str("APPLIANCE_LDAP_USER_FILTER") or "(objectClass=inetOrgPerson)"
APPLIANCE_LDAP_USERNAME_ATTRIBUTE = env_str("APPLIANCE_LDAP_USERNAME_ATTRIBUTE") or "uid"
# The id the directory never reuses: entryUUID (OpenLDAP, 389-ds), objectGUID (Active Directory).
APPLIANCE_LDAP_ID_ATTRIBUTE = env_str("APPLIANCE_LDAP_ID_ATTRIBUTE") or "entryUUID"
APPLIANCE_LDAP_GROUP_SEARCH_BASE = env_str("APPLIANCE_LDAP_GROUP_SEARCH_BASE") or ""
# {user_dn} is the account's DN. Active Directory, nested groups included:
# (&(objectClass=group)(member:1.2.840.113556.1.4.1941:={user_dn}))
APPLIANCE_LDAP_GROUP_FILTER = (
    env_str("APPLIANCE_LDAP_GROUP_FILTER") or "(&(objectClass=groupOfNames)(member={user_dn}))"
)
# JSON: directory group DN -> appliance group name(s); staff and superusers: DNs separated by ";".
APPLIANCE_LDAP_GROUP_MAP = parse_group_map(env_str("APPLIANCE_LDAP_GROUP_MAP"), setting="APPLIANCE_LDAP_GROUP_MAP")
APPLIANCE_LDAP_STAFF_GROUPS = parse_group_list(env_str("APPLIANCE_LDAP_STAFF_GROUPS"))
APPLIANCE_LDAP_SUPERUSER_GROUPS = parse_group_list(env_str("APPLIANCE_LDAP_SUPERUSER_GROUPS"))
APPLIANCE_LDAP_TIMEOUT_S = env_float("APPLIANCE_LDAP_TIMEOUT_S", 5.0, minimum=0.5)
# Every so often (Celery beat, in the web role's `beat` process) every LDAP-linked account is
# brought in line with the directory: groups, flags, deactivated when the directory lost it.
APPLIANCE_LDAP_SYNC_INTERVAL_S = env_int("APPLIANCE_LDAP_SYNC_INTERVAL_S", 900, minimum=5)
if APPLIANCE_LDAP_URLS:
    if not APPLIANCE_LDAP_USER_SEARCH_BASE:
        raise EnvError("APPLIANCE_LDAP_URL is set: set APPLIANCE_LDAP_USER_SEARCH_BASE too")
    AUTHENTICATION_BACKENDS.append("directory.backends.LdapBackend")
# OpenID Connect: the authorization code flow with PKCE (mozilla-django-oidc), endpoints from the
# provider's discovery document (or its issuer URL), client secret from the environment or _FILE.
APPLIANCE_OIDC_DISCOVERY_URL = env_str("APPLIANCE_OIDC_DISCOVERY_URL")
APPLIANCE_OIDC_NAME = env_str("APPLIANCE_OIDC_NAME") or "your organisation"  # "Sign in with <name>"
APPLIANCE_OIDC_USERNAME_CLAIM = env_str("APPLIANCE_OIDC_USERNAME_CLAIM") or "preferred_username"
APPLIANCE_OIDC_GROUPS_CLAIM = env_str("APPLIANCE_OIDC_GROUPS_CLAIM") or "groups"
APPLIANCE_OIDC_GROUP_MAP = parse_group_map(env_str("APPLIANCE_OIDC_GROUP_MAP"), setting="APPLIANCE_OIDC_GROUP_MAP")
APPLIANCE_OIDC_STAFF_GROUPS = parse_group_list(env_str("APPLIANCE_OIDC_STAFF_GROUPS"))
APPLIANCE_OIDC_SUPERUSER_GROUPS = parse_group_list(env_str("APPLIANCE_OIDC_SUPERUSER_GROUPS"))
APPLIANCE_OIDC_CA_FILE = env_str("APPLIANCE_OIDC_CA_FILE")  # the provider's CA, if not the system's
APPLIANCE_OIDC_TIMEOUT_S = env_float("APPLIANCE_OIDC_TIMEOUT_S", 10.0, minimum=0.5)
# The sign-in page shows the local form (user name and password) beside the provider's button;
# false: the button alone, the form only at /accounts/login/?local=1 (break-glass administrator).
APPLIANCE_LOCAL_SIGNIN_FORM = env_bool("APPLIANCE_LOCAL_SIGNIN_FORM", True)
OIDC_RP_CLIENT_ID = env_str("APPLIANCE_OIDC_CLIENT_ID") or ""
OIDC_RP_CLIENT_SECRET = env_str("APPLIANCE_OIDC_CLIENT_SECRET") or ""  # or _FILE
OIDC_RP_SIGN_ALGO = env_choice("APPLIANCE_OIDC_SIGN_ALGO", "RS256", ("RS256", "RS384", "RS512", "ES256", "ES384"))
OIDC_RP_SCOPES = env_str("APPLIANCE_OIDC_SCOPES") or "openid email profile"
OIDC_USE_PKCE = True
OIDC_PKCE_CODE_CHALLENGE_METHOD = "S256"
OIDC_AUTHENTICATE_CLASS = "directory.oidc.SignInRequestView"
OIDC_CALLBACK_CLASS = "directory.oidc.CallbackView"
# A session begun with the provider ends after this long, so that the provider is asked again
# (its groups, a disabled account) even where the sync cannot ask it (no refresh token).
APPLIANCE_OIDC_SESSION_S = env_int("APPLIANCE_OIDC_SESSION_S", 8 * 3600, minimum=60)
OIDC_TIMEOUT = APPLIANCE_OIDC_TIMEOUT_S
LOGIN_REDIRECT_URL_FAILURE = "/accounts/login/?oidc=failed"
if APPLIANCE_OIDC_DISCOVERY_URL:
    if not OIDC_RP_CLIENT_ID:
        raise EnvError("APPLIANCE_OIDC_DISCOVERY_URL is set: set APPLIANCE_OIDC_CLIENT_ID too")
    AUTHENTICATION_BACKENDS.append("directory.oidc.OidcBackend")
# Every so often each OIDC-linked account's refresh token is presented to the provider: refused
# (the account deleted or disabled there), the account is deactivated here; accepted, its groups
# are read again. 0: off (then the session lifetime above is the only bound).
APPLIANCE_OIDC_SYNC_INTERVAL_S = env_int("APPLIANCE_OIDC_SYNC_INTERVAL_S", 900, minimum=0)
if 0 < APPLIANCE_OIDC_SYNC_INTERVAL_S < 5:
    raise EnvError("APPLIANCE_OIDC_SYNC_INTERVAL_S must be 0 (off) or at least 5")
# Celery beat's schedule (the `beat` process, started with the web role when a schedule is set:
# always, unless sources are turned off and no directory is configured);
# each run expires after its interval, so that never two wait.
CELERY_BEAT_SCHEDULE = {}
if APPLIANCE_SOURCE_TICK_S:
    CELERY_BEAT_SCHEDULE["sources-poll"] = {
        "task": "documents.tasks.poll_due_sources",
        "schedule": float(APPLIANCE_SOURCE_TICK_S),
        "options": {"expires": float(APPLIANCE_SOURCE_TICK_S)},
    }
if APPLIANCE_LDAP_URLS:
    CELERY_BEAT_SCHEDULE["ldap-sync"] = {
        "task": "directory.tasks.ldap_sync",
        "schedule": float(APPLIANCE_LDAP_SYNC_INTERVAL_S),
        "options": {"expires": float(APPLIANCE_LDAP_SYNC_INTERVAL_S)},
    }
if APPLIANCE_OIDC_DISCOVERY_URL and APPLIANCE_OIDC_SYNC_INTERVAL_S:
    CELERY_BEAT_SCHEDULE["oidc-sync"] = {
        "task": "directory.tasks.oidc_sync",
        "schedule": float(APPLIANCE_OIDC_SYNC_INTERVAL_S),
        "options": {"expires": float(APPLIANCE_OIDC_SYNC_INTERVAL_S)},
    }

LOGIN_REDIRECT_URL = "documents:library"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-gb"
TIME_ZONE = env_str("APPLIANCE_TIME_ZONE") or "UTC"
USE_I18N = True
USE_TZ = True

SESSION_COOKIE_HTTPONLY = True
# Served over HTTPS (a reverse proxy in front ending TLS, which sets X-Forwarded-Proto and drops
# any a client sent): cookies only over TLS, plain HTTP redirected, and browsers told to use
# HTTPS only (HSTS) for APPLIANCE_HSTS_SECONDS. Off on the embedded default (http on loopback).
APPLIANCE_TLS = env_bool("APPLIANCE_TLS", env_bool("APPLIANCE_SECURE_COOKIES", False))
SESSION_COOKIE_SECURE = APPLIANCE_TLS
CSRF_COOKIE_SECURE = APPLIANCE_TLS
if APPLIANCE_TLS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]  # probes and scrapers on the box itself
    SECURE_HSTS_SECONDS = env_int("APPLIANCE_HSTS_SECONDS", 31_536_000, minimum=0)
    # Subdomains of the appliance's own host name (not its organisation's domain) are HTTPS too.
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("APPLIANCE_HSTS_INCLUDE_SUBDOMAINS", True)
# The HSTS preload list is for public domains; an appliance's internal host name is not on it.
# W001-W003 look for Django's security, clickjacking and CSRF middleware by path, and cannot see
# the subclasses in MIDDLEWARE; appliance.checks asks the same of the classes, as an error.
SILENCED_SYSTEM_CHECKS = ["security.W021", "security.W001", "security.W002", "security.W003"]
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("APPLIANCE_LOG_LEVEL") or "INFO"},
    # Every connection taken and given back is an INFO line; its warnings (a failed connect) stay.
    "loggers": {"psycopg.pool": {"level": "WARNING"}},
}

# The embedded services' passwords are in the URLs above: not settings of their own, and hidden
# (with every *_URL) on a debug page.
del _EMBEDDED, _PG_LOGIN, _REDIS_LOGIN
DEFAULT_EXCEPTION_REPORTER_FILTER = "appliance.reporting.SecretsHiddenFilter"
