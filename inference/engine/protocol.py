"""The wire format between the engine host and its clients: one JSON object per line.

A client opens one connection per call over the engine host's Unix socket and sends one request
line; the host answers with one or more event lines and closes. For ``generate``, the connection
*is* the request: if the client goes away, the engine request is aborted and its KV reservation
freed. Pure: no sockets here, only encoding, decoding and the shapes of messages.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from inference.sampling import NO_EXTRAS, SamplingExtras

MAX_LINE_BYTES = 64 * 1024 * 1024  # a request may carry a long document


class ProtocolError(ValueError):
    """A line that is not a well-formed message."""


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"not a JSON line: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("a message must be a JSON object")
    return message


class EngineState:
    """``state`` in a ``stats`` answer. While the host starts its engine core again it still
    answers ``stats`` (with ``restarting`` and what it knows), so that health checks go red at
    once rather than time out, and turn green when the new engine core is ready."""

    READY = "ready"
    RESTARTING = "restarting"

    @classmethod
    def of(cls, stats: dict[str, Any]) -> str:
        """The state a ``stats`` answer reports; a host from before the field answers only once
        its engine is ready."""
        return str(stats.get("state", cls.READY))


def _api(default: Any = None, *, staff: bool = False) -> Any:
    """A field ``GET /api/v1/engine`` shows (``staff``: to staff only)."""
    return field(default=default, metadata={"api": "staff" if staff else "public"})


@dataclass(frozen=True)
class EngineStats:
    """A ``stats`` answer, as its readers see it: what the engine loaded and how it runs now.

    The host sends a JSON object with these keys (and ``type``); ``from_message`` reads one,
    taking what it knows (a field a host does not send is None: an older host, or one restarting
    that knows less) and leaving the rest. The engine host's tests check that every key it sends
    is declared here, so a reader never looks for a key by a name nobody sends. ``api`` in a
    field's metadata says who sees it in ``GET /api/v1/engine``."""

    state: str = EngineState.READY
    # What the engine loaded.
    model: str | None = _api()
    model_path: str | None = None
    licence: str | None = _api()
    dtype: str | None = _api()
    kv_cache_dtype: str | None = _api()
    max_model_len: int | None = _api()
    kv_capacity_tokens: int | None = _api()
    kv_block_size: int | None = _api()
    kv_blocks: int | None = None
    max_num_seqs: int | None = _api()
    gpu_memory_utilization: float | None = None
    max_num_batched_tokens: int | None = _api()
    prefix_caching: bool | None = None
    enforce_eager: bool | None = None
    vllm_scheduling_policy: str | None = None
    scheduler_class: str | None = None
    async_scheduling: bool | None = None
    pid: int | None = None
    # A CPU engine: the cores its model runs on, and those the appliance's services are kept on
    # (appliance.cpus); absent when they run anywhere. Staff only, as the machine's layout.
    model_cpus: list[int] | None = _api(staff=True)
    service_cpus: list[int] | None = _api(staff=True)
    # Software versions tell an attacker which known flaws to try: staff only.
    vllm_version: str | None = _api(staff=True)
    torch_version: str | None = _api(staff=True)
    device: str | None = None  # "cuda" or "cpu"
    device_name: str | None = None
    device_count: int | None = None  # devices this engine host sees (CUDA_VISIBLE_DEVICES)
    tensor_parallel_size: int | None = None  # of them, the GPUs the model is spread over
    device_memory_bytes: int | None = None
    cpu_count: int | None = None
    driver: str | None = None
    # How it runs now.
    restarts: int | None = None  # engine-core restarts since the host started
    last_engine_death: dict[str, Any] | None = None
    running: int | None = _api()
    waiting: int | None = _api()
    kv_usage: float | None = _api()
    prefix_cache_hit_rate: float | None = _api()
    preemptions: int | None = _api()
    requests_served: int | None = _api()
    requests_in_host: int | None = None
    request_ids: list[str] | None = None  # the requests the host holds ("<job>-<attempt>-<part>")
    # vLLM's timing of finished requests, summed (queue_s, prefill_s, ttft_s and their counts).
    request_timing: dict[str, float | int] | None = None
    uptime_s: float | None = _api()
    scheduling: str | None = _api()  # the scheduler's mode: appliance, engine or fifo
    kv_reservation: str | None = None  # max or predicted
    kv_budget_tokens: int | None = None
    kv_reserved_tokens: int | None = None
    kv_reserved_future_tokens: int | None = None
    admitted_requests: int | None = None
    admitted_request_ids: list[str] | None = None  # of them, those holding a KV reservation
    waiting_for_admission: int | None = None
    drafting_requests: int | None = None
    documents_held: int | None = None
    document_budget_tokens: int | None = None  # known only while drafting runs
    # The engine's time spent reading documents' prompt tokens lately (a share), while they wanted prefill (the scheduler's
    # estimate; its floor is APPLIANCE_DOCUMENT_MIN_SHARE). None: no document is prefilling.
    document_share: float | None = None
    target_step_ms: float | None = None  # known only while drafting runs
    scheduler: dict[str, Any] | None = None  # the scheduler's own snapshot (its plan, costs)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def api_fields(cls, *, staff: bool) -> tuple[str, ...]:
        """The fields ``GET /api/v1/engine`` shows, in declaration order."""
        shown = ("public", "staff") if staff else ("public",)
        return tuple(f.name for f in fields(cls) if f.metadata.get("api") in shown)

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> EngineStats:
        known = set(cls.field_names())
        values = {key: value for key, value in message.items() if key in known}
        values["state"] = str(message.get("state", EngineState.READY))
        return cls(**values)

    def to_message(self) -> dict[str, Any]:
        return {"type": "stats", **asdict(self)}


class ErrorCode:
    """``code`` of an ``error`` event. The client turns ``ENGINE_RESTARTING`` into
    ``EngineRestarting`` (retry later); every other code into ``EngineRequestError`` (final)."""

    PROTOCOL = "protocol"  # a malformed line
    TOO_LONG = "too_long"  # prompt + max_tokens do not fit the model's context
    KV_BUDGET = "kv_budget"  # the request could never fit the KV cache
    ENGINE = "engine"  # the engine failed this request (and lives on)
    # The engine core died or is being started again. ``in_flight``: this request was in the
    # engine when it died (so it may be the cause); false when it arrived during the restart.
    ENGINE_RESTARTING = "engine_restarting"
    UNAUTHORIZED = "unauthorized"  # the line did not carry the host's token
    FORBIDDEN = "forbidden"  # a benchmark operation on a host not started for a benchmark


# Operations that change how the engine schedules, empty its cache or bypass admission: only a
# host a benchmark started (``APPLIANCE_ENGINE_BENCHMARK_OPS``) serves them.
BENCHMARK_OPS = frozenset({"set_scheduling", "reset_prefix_cache", "run_direct"})


class Priority:
    """Engine priorities: a lower number is scheduled first (vLLM's ``priority`` scheduling)."""

    DECODE = 0  # drafting and chat: a person is watching text appear
    PREFILL = 10  # document jobs: long prompts, short answers


@dataclass(frozen=True)
class GenerateRequest:
    request_id: str
    messages: list[dict[str, str]]
    max_tokens: int
    priority: int = Priority.PREFILL
    temperature: float = 0.0
    top_p: float = 1.0
    frequency_penalty: float = 0.0  # > 0 discourages repeating tokens the output already has (not the prompt)
    seed: int | None = None
    queue: str = "prefill"
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False  # benchmarks: always write max_tokens
    json_schema: dict[str, Any] | None = None  # guided decoding: the output must match this schema
    # Who the request is for (the job's owner): the engine's scheduler takes turns between users.
    user: str = ""
    # Whose prefix cache the request may share (vLLM's ``cache_salt``: requests with different
    # salts never share a cached block). "" shares with every other request without one.
    cache_salt: str = ""
    # The job was in the engine when its engine core died: the host runs such requests one at a
    # time, so that a request that kills the engine takes no other suspect with it.
    suspect: bool = False
    # A raw prompt (``/v1/completions``): read as the text it is, with no chat template around it,
    # instead of ``messages`` (then empty). Whoever writes it writes the whole prompt, so its
    # control markers are read as such, as vLLM's own completions endpoint reads them.
    prompt: str = ""
    # What else an OpenAI client may ask of the sampling (a chat job's): flat in the message, and
    # only what differs from vLLM's defaults, so that the fingerprint of a request without them
    # stays what it was.
    extras: SamplingExtras = NO_EXTRAS

    @property
    def drafting(self) -> bool:
        """A drafting request (decode priority or above), not a document's."""
        return self.priority <= Priority.DECODE

    def to_message(self) -> dict[str, Any]:
        message = {"op": "generate", **asdict(self)}
        del message["extras"]
        message.update(self.extras.to_json())
        if not self.prompt:
            # Left out when unused: a request's fingerprint (``running.request_fingerprint``, which
            # a summary's finished sections are kept under) stays what it was before raw prompts.
            del message["prompt"]
        return message

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> GenerateRequest:
        try:
            request = cls(
                request_id=str(message["request_id"]),
                messages=[{"role": str(m["role"]), "content": str(m["content"])} for m in message.get("messages", [])],
                max_tokens=int(message["max_tokens"]),
                priority=int(message.get("priority", Priority.PREFILL)),
                temperature=float(message.get("temperature", 0.0)),
                top_p=float(message.get("top_p", 1.0)),
                frequency_penalty=float(message.get("frequency_penalty", 0.0)),
                seed=None if message.get("seed") is None else int(message["seed"]),
                queue=str(message.get("queue", "prefill")),
                stop=[str(s) for s in message.get("stop", [])],
                ignore_eos=bool(message.get("ignore_eos", False)),
                json_schema=message.get("json_schema"),
                user=str(message.get("user", "")),
                cache_salt=str(message.get("cache_salt") or ""),
                suspect=bool(message.get("suspect", False)),
                prompt=str(message.get("prompt") or ""),
                extras=SamplingExtras.from_json(message),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"bad generate request: {exc!r}") from None
        if not request.request_id:
            raise ProtocolError("bad generate request: empty request_id")
        if request.max_tokens < 1:
            raise ProtocolError("bad generate request: max_tokens must be at least 1")
        if not request.messages and not request.prompt:
            raise ProtocolError("bad generate request: no messages and no prompt")
        if request.messages and request.prompt:
            raise ProtocolError("bad generate request: both messages and a raw prompt (one or the other)")
        if not -2.0 <= request.frequency_penalty <= 2.0:
            raise ProtocolError("bad generate request: frequency_penalty must be between -2 and 2")
        if request.json_schema is not None and not isinstance(request.json_schema, dict):
            raise ProtocolError("bad generate request: json_schema must be an object")
        problem = request.extras.problem(request.max_tokens)
        if problem:
            raise ProtocolError(f"bad generate request: {problem[1]}")
        return request
