"""The spec sheet's figures, answers and files, from the requests ``manage.py specsheet`` timed
(pure: no HTTP, no database; the run itself is in ``measure.specsheet_run``).

Every request is timed by the client, as a user would feel it: from sending the request to each
delta of text arriving, each delta saying how many tokens it carries. From those:

- **TTFT**: request sent -> first token arrived (queue, admission and prefill included);
- **ITL**: the gap between tokens (a delta of n tokens after a gap g counts n gaps of g/n);
- **tokens/s per user**: a request's tokens after the first over the time they took to arrive;
- **aggregate tokens/s** and **requests/s**: all tokens (requests) of a level over its wall time;
- **goodput**: the share of requests that met the target (TTFT <= ``ttft_ms`` and mean ITL <=
  ``itl_ms``). A level *meets the target* when its goodput is at least ``min_goodput``; the
  highest level that does, with every lower level meeting it too, is the number of concurrent
  users the box serves for that profile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference.timing import Delta, RequestTiming, inter_token_latencies_ms, percentile, request_timing

SHEET_VERSION = 1
PROFILES = ("document", "drafting", "mixed")
QUESTIONS = (
    ("model", "Which model, under which licence?"),
    ("precision", "At what precision are the weights and the KV cache?"),
    ("context", "At what context length?"),
    ("users", "For how many concurrent users?"),
    ("lengths", "With what input and output lengths?"),
    ("tokens_per_s", "At how many tokens per second per user?"),
    ("ttft", "At what time to first token?"),
    ("hardware", "On what hardware?"),
)


@dataclass(frozen=True)
class Targets:
    ttft_ms: float = 2000.0
    itl_ms: float = 100.0
    min_goodput: float = 0.9

    def describe(self) -> str:
        return (
            f"TTFT <= {_seconds(self.ttft_ms)} and mean ITL <= {self.itl_ms:g} ms "
            f"for at least {self.min_goodput:.0%} of requests"
        )


@dataclass
class Sample:
    """One request. ``sent_at`` and ``first_token_at`` are the client's clock (``time.time()``):
    the TTFT the user felt. ``deltas`` are the tokens as they reached the appliance's worker, each
    batch with its time and count (the stream to the client batches them every 100 ms, which
    would hide the gaps between them; the worker's clock is the same machine's). ``error`` is set
    when the request did not finish; ``restarts`` counts the times the appliance started it
    again (its tokens are then those of the last attempt)."""

    kind: str
    sent_at: float
    deltas: list[Delta] = field(default_factory=list)
    first_token_at: float | None = None
    finished_at: float | None = None
    prompt_tokens: int | None = None
    error: str = ""
    restarts: int = 0

    @property
    def ok(self) -> bool:
        return not self.error and self.finished_at is not None and any(d.tokens for d in self.deltas)

    @property
    def ttft_ms(self) -> float | None:
        first = self.first_token_at or next((d.at for d in self.deltas if d.tokens), None)
        return None if first is None else max(0.0, (first - self.sent_at) * 1000)

    @property
    def timing(self) -> RequestTiming:
        """ITL and decode tokens/s from the tokens' times (its TTFT is ``ttft_ms``'s)."""
        return request_timing(created_at=self.sent_at, started_at=self.sent_at, deltas=self.deltas)

    def meets(self, targets: Targets) -> bool:
        if not self.ok or self.ttft_ms is None:
            return False
        itl = self.timing.itl_mean_ms
        return self.ttft_ms <= targets.ttft_ms and (itl is None or itl <= targets.itl_ms)


def ladder(max_concurrency: int) -> list[int]:
    """1, 2, 4, ... up to ``max_concurrency``, which is always the last rung."""
    levels, level = [], 1
    while level < max_concurrency:
        levels.append(level)
        level *= 2
    return [*levels, max(1, max_concurrency)]


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def summarise_level(samples: list[Sample], *, concurrency: int, wall_s: float, targets: Targets) -> dict[str, Any]:
    """The figures of one concurrency level of one profile."""
    done = [s for s in samples if s.ok]
    timings = [s.timing for s in done]
    ttfts = [s.ttft_ms for s in done if s.ttft_ms is not None]
    itls = [gap for s in done for gap in inter_token_latencies_ms([d for d in s.deltas if d.tokens > 0])]
    per_user = [t.decode_tokens_per_s for t in timings if t.decode_tokens_per_s is not None]
    output = sum(t.output_tokens for t in timings)
    prompts = [s.prompt_tokens for s in done if s.prompt_tokens]
    met = sum(s.meets(targets) for s in samples)
    goodput = met / len(samples) if samples else 0.0
    errors = sorted({s.error for s in samples if s.error})
    return {
        "concurrency": concurrency,
        "requests": len(samples),
        "failed": len(samples) - len(done),
        "errors": errors[:3],
        "restarted": sum(1 for s in samples if s.restarts),
        "ttft_p50_ms": _round(percentile(ttfts, 50)),
        "ttft_p95_ms": _round(percentile(ttfts, 95)),
        "itl_p50_ms": _round(percentile(itls, 50)),
        "itl_p95_ms": _round(percentile(itls, 95)),
        "tokens_per_s_per_user": _round(percentile(per_user, 50), 2),
        "tokens_per_s_per_user_p5": _round(percentile(per_user, 5), 2),  # the slowest users' share
        "aggregate_tokens_per_s": _round(output / wall_s if wall_s > 0 else None, 2),
        "requests_per_s": _round(len(done) / wall_s if wall_s > 0 else None, 4),
        "goodput": round(goodput, 3),
        "meets_target": bool(samples) and goodput >= targets.min_goodput,
        "wall_s": round(wall_s, 2),
        "prompt_tokens_mean": _round(sum(prompts) / len(prompts) if prompts else None),
        "output_tokens_mean": _round(output / len(done) if done else None),
    }


def users_served(levels: list[dict[str, Any]]) -> int | None:
    """The highest concurrency that meets the target with every lower level meeting it too
    (None: nothing was measured, which is not the same as 0)."""
    if not levels:
        return None
    served = 0
    for level in sorted(levels, key=lambda row: row["concurrency"]):
        if not level["meets_target"]:
            break
        served = level["concurrency"]
    return served


def level_at(levels: list[dict[str, Any]], concurrency: int) -> dict[str, Any] | None:
    return next((row for row in levels if row["concurrency"] == concurrency), None)


# --- the decode ceiling at batch size 1 ---------------------------------------------------------


def decode_ceiling(
    *,
    bandwidth_bytes_per_s: float | None,
    weight_bytes: int,
    kv_bytes_per_token: int,
    context_tokens: int,
    measured_tokens_per_s: float | None,
) -> dict[str, Any]:
    """One user's decode can go no faster than the memory can deliver what a step reads: every
    weight once, and the KV cache of the context so far."""
    bytes_per_step = weight_bytes + kv_bytes_per_token * context_tokens
    ceiling = bandwidth_bytes_per_s / bytes_per_step if bandwidth_bytes_per_s and bytes_per_step else None
    return {
        "bandwidth_gb_s": _round(bandwidth_bytes_per_s / 1e9 if bandwidth_bytes_per_s else None, 2),
        "weight_bytes": weight_bytes,
        "kv_bytes_per_token": kv_bytes_per_token,
        "context_tokens": context_tokens,
        "bytes_per_step": bytes_per_step,
        "ceiling_tokens_per_s": _round(ceiling, 2),
        "measured_tokens_per_s": measured_tokens_per_s,
        "share_of_ceiling": _round(measured_tokens_per_s / ceiling if ceiling and measured_tokens_per_s else None, 3),
    }


# --- the eight answers --------------------------------------------------------------------------


def _seconds(ms: float | None) -> str:
    if ms is None:
        return "n/a"
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.0f} ms"


def _tokens_per_s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} tokens/s"


def _gib(value: int | float | None) -> str:
    return "unknown memory" if not value else f"{value / 1024**3:.1f} GiB"


def hardware_line(hardware: dict[str, Any]) -> str:
    cpu = f"{hardware.get('cpu') or 'unknown CPU'}, {hardware.get('cpus') or '?'} cores, {_gib(hardware.get('ram_bytes'))} RAM"
    if hardware.get("device") == "cpu":
        parts = [f"no GPU: the model runs on the CPU ({cpu})"]
    else:
        count = hardware.get("device_count") or 1
        device = f"{hardware.get('device_name') or 'unknown GPU'} ({_gib(hardware.get('device_memory_bytes'))})"
        parts = [f"{count} x {device}" if count > 1 else device, f"host {cpu}"]
    if "driver" in hardware or "cuda" in hardware:  # (a sheet shown without versions has neither)
        parts.append(f"driver {hardware.get('driver') or 'none'}, CUDA {hardware.get('cuda') or 'none'}")
    if "vllm" in hardware or "torch" in hardware:
        parts.append(f"vLLM {hardware.get('vllm') or '?'}, torch {hardware.get('torch') or '?'}")
    return "; ".join(parts)


# A sheet measured before the topology was recorded: one engine on one node.
ONE_ENGINE: dict[str, Any] = {"gpus_per_engine": 1, "engines_per_node": 1, "nodes": 1, "engines": 1}


def topology_line(topology: dict[str, Any]) -> str:
    """``measured on one engine of 2 GPUs (tensor parallel); this cluster: 3 nodes, 6 engines``."""
    gpus = topology["gpus_per_engine"]
    engine = f"one engine of {gpus} GPUs (tensor parallel)" if gpus > 1 else "one engine"
    nodes, engines = topology["nodes"], topology["engines"]
    cluster = f"{nodes} node{'s' if nodes != 1 else ''}, {engines} engine{'s' if engines != 1 else ''}"
    return f"measured on {engine}; this deployment: {cluster} ({topology['engines_per_node']} per node)"


def topology_section(sheet: dict[str, Any]) -> list[str]:
    """Which figures are per engine and which for the whole cluster."""
    topology = sheet.get("topology") or ONE_ENGINE
    engines = topology["engines"]
    lines = ["", "## Topology", "", f"Every figure above was {topology_line(topology)}."]
    if engines > 1:
        kv = (sheet["engine"].get("kv_capacity_tokens") or 0) * engines
        lines.append(
            f"Per engine: users served, TTFT, ITL, tokens/s per user and aggregate tokens/s. For the cluster: the "
            f"KV cache holds {kv:,} tokens on {engines} engines; placement spreads jobs over them, so users served "
            f"and aggregate tokens/s can reach {engines} x the per-engine figures while TTFT and tokens/s per user "
            f"stay those of one engine. That multiple is not measured here: `python manage.py bench cluster` "
            f"measures jobs per node and what a lost node costs."
        )
    else:
        lines.append("One engine serves every request: every figure is the whole deployment's.")
    return lines


def lengths_text(profile: dict[str, Any]) -> str:
    """``6,144 in / 256 out``, or for the mixed profile each kind's."""
    pairs = [(kind, profile["inputs"][kind], profile["outputs"][kind]) for kind in profile["inputs"]]
    if len(pairs) == 1:
        return f"{pairs[0][1]:,} in / {pairs[0][2]:,} out"
    return " and ".join(f"{kind} {tokens_in:,} in / {tokens_out:,} out" for kind, tokens_in, tokens_out in pairs)


def _users(n: int) -> str:
    return f"{n} user{'s' if n != 1 else ''}"


def answers(sheet: dict[str, Any]) -> list[dict[str, str]]:
    """The eight questions a buyer should ask, answered from the sheet's own measurements."""
    model, engine, profiles = sheet["model"], sheet["engine"], sheet["profiles"]
    targets = Targets(**sheet["targets"])
    topology = sheet.get("topology") or ONE_ENGINE
    cluster_kv = (engine.get("kv_capacity_tokens") or 0) * topology["engines"] if topology["engines"] > 1 else 0

    def per_profile(describe: Callable[[dict[str, Any]], str]) -> str:
        return "; ".join(
            f"{p['label'].lower()}: {describe(p) if p.get('levels') else 'not measured (' + (p.get('stopped') or '?') + ')'}"
            for p in profiles.values()
        )

    def at_served(p: dict[str, Any], describe: Callable[[dict[str, Any]], str]) -> str:
        """At the lowest level, and at the users served if that is another level."""
        first = p["levels"][0]
        served = level_at(p["levels"], p["users_served"]) if p["users_served"] else None
        text = f"{describe(first)} at {_users(first['concurrency'])}"
        if served and served is not first:
            text += f", {describe(served)} at {_users(served['concurrency'])}"
        return text

    def lengths(p: dict[str, Any]) -> str:
        measured_in = [row["prompt_tokens_mean"] for row in p["levels"] if row.get("prompt_tokens_mean")]
        text = lengths_text(p)
        if measured_in and len(p["inputs"]) == 1:
            text += f" (prompts measured {min(measured_in):,.0f}-{max(measured_in):,.0f} tokens)"
        return text

    def ttft(row: dict[str, Any]) -> str:
        return f"{_seconds(row.get('ttft_p50_ms'))} (p95 {_seconds(row.get('ttft_p95_ms'))})"

    texts = {
        "model": f"{model['name']}, licence {model.get('licence') or 'not stated'}",
        "precision": f"weights {engine.get('dtype') or '?'}, KV cache {engine.get('kv_cache_dtype') or '?'}",
        "context": (
            f"{engine.get('max_model_len') or 0:,} tokens configured; the KV cache holds "
            f"{engine.get('kv_capacity_tokens') or 0:,} tokens in all per engine"
            + (f", {cluster_kv:,} on the cluster's {topology['engines']} engines" if cluster_kv else "")
        ),
        "users": per_profile(lambda p: f"{p['users_served']} (stopped by {p.get('stopped') or 'the ladder'})")
        + f" per engine; target: {targets.describe()}",
        "lengths": per_profile(lengths),
        "tokens_per_s": per_profile(lambda p: at_served(p, lambda row: _tokens_per_s(row.get("tokens_per_s_per_user"))))
        + " (median per user)",
        "ttft": per_profile(lambda p: at_served(p, ttft)) + " (p50 and p95, from sending the request, queue included)",
        "hardware": hardware_line(sheet["hardware"]) + "; " + topology_line(topology),
    }
    return [{"key": key, "question": question, "answer": texts[key]} for key, question in QUESTIONS]


# --- Markdown and charts ------------------------------------------------------------------------

_COLUMNS = (
    ("concurrency", "users", lambda v: f"{v}"),
    ("requests", "requests", lambda v: f"{v}"),
    ("failed", "failed", lambda v: f"{v}"),
    ("ttft_p50_ms", "TTFT p50", _seconds),
    ("ttft_p95_ms", "TTFT p95", _seconds),
    ("itl_p50_ms", "ITL p50", lambda v: "n/a" if v is None else f"{v:.1f} ms"),
    ("itl_p95_ms", "ITL p95", lambda v: "n/a" if v is None else f"{v:.1f} ms"),
    ("tokens_per_s_per_user", "tokens/s per user", lambda v: "n/a" if v is None else f"{v:.1f}"),
    ("aggregate_tokens_per_s", "aggregate tokens/s", lambda v: "n/a" if v is None else f"{v:.1f}"),
    ("requests_per_s", "requests/s", lambda v: "n/a" if v is None else f"{v:.3f}"),
    ("goodput", "goodput", lambda v: f"{v:.0%}"),
    ("meets_target", "meets target", lambda v: "yes" if v else "no"),
)


def _or_not_measured(value: object) -> str:
    return "not measured" if value is None else str(value)


def level_table(levels: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| " + " | ".join(title for _, title, _ in _COLUMNS) + " |",
        "|" + "|".join(" ---: " for _ in _COLUMNS) + "|",
    ]
    for row in levels:
        lines.append("| " + " | ".join(fmt(row.get(key)) for key, _, fmt in _COLUMNS) + " |")
    return lines


def markdown(sheet: dict[str, Any]) -> str:
    targets = Targets(**sheet["targets"])
    lines = [
        f"# Spec sheet: {sheet['model']['name']} on {sheet['hardware'].get('device_name') or 'this box'}",
        "",
        f"Measured {sheet['started_at']} in {sheet['duration_s']:.0f} s by `python manage.py specsheet"
        + (" --quick`. **A quick sheet is a smoke test, not figures to quote.**" if sheet["quick"] else "`."),
        f"Every request went through the appliance's API, its queues and its engine host, timed by the client. "
        f"Target: {targets.describe()}.",
        "",
        "## The eight questions",
        "",
    ]
    for item in sheet["answers"]:
        lines.append(f"- **{item['question']}** {item['answer']}.")
    for profile in sheet["profiles"].values():
        lines += [
            "",
            f"## {profile['label']}: {profile['description']}",
            "",
            f"Tokens: {lengths_text(profile)}; {profile['requests_per_user']} request(s) per user, one after "
            f"another. **Users served: {_or_not_measured(profile['users_served'])}**"
            + (f" (stopped by {profile['stopped']})." if profile.get("stopped") else "."),
            "",
        ]
        lines += level_table(profile["levels"]) if profile["levels"] else ["Not measured."]
        for row in profile["levels"]:
            for error in row.get("errors", []):
                lines.append(f"\nAt {row['concurrency']} users a request failed: {error}")
    ceiling = sheet.get("decode_ceiling")
    if ceiling:
        lines += [
            "",
            "## Decode ceiling at batch size 1",
            "",
            f"Memory bandwidth {ceiling['bandwidth_gb_s'] or 'unknown'} GB/s ({ceiling.get('bandwidth_source')}); a step "
            f"reads {ceiling['bytes_per_step'] / 1e6:,.1f} MB (the weights, {ceiling['weight_bytes'] / 1e6:,.1f} MB, "
            f"and {ceiling['context_tokens']:,} tokens of KV cache), so one user can get at most "
            f"{_tokens_per_s(ceiling['ceiling_tokens_per_s'])}. Measured at 1 user (drafting): "
            f"{_tokens_per_s(ceiling['measured_tokens_per_s'])}"
            + (f", {ceiling['share_of_ceiling']:.0%} of the ceiling." if ceiling.get("share_of_ceiling") else "."),
        ]
    lines += topology_section(sheet)
    hardware = sheet["hardware"]
    lines += ["", "## Hardware and software", "", f"{hardware_line(hardware)}; {hardware.get('platform', '')}."]
    engine = sheet["engine"]
    lines += [
        "",
        f"Engine: max {engine.get('max_num_seqs')} requests at once, {engine.get('max_num_batched_tokens')} tokens a "
        f"step, KV block {engine.get('kv_block_size')} tokens; worker pools prefill {sheet['appliance'].get('prefill_concurrency')}, "
        f"decode {sheet['appliance'].get('decode_concurrency')}; scheduling {engine.get('scheduling')}.",
    ]
    charts = sheet.get("charts") or {}
    if charts:
        lines += [
            "",
            f"![TTFT against concurrency]({charts['ttft']})",
            "",
            f"![Tokens/s per user]({charts['tokens_per_s']})",
        ]
    return "\n".join(lines) + "\n"


def draw_charts(sheet: dict[str, Any], *, ttft_path: Path, tokens_path: Path) -> None:
    """TTFT (p50 and p95) and tokens/s per user against concurrency, one line per profile."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    profiles = [(p["label"], p["levels"]) for p in sheet["profiles"].values() if p["levels"]]
    title = f"{sheet['model']['name']} on {sheet['hardware'].get('device_name') or 'this box'}"
    if sheet["quick"]:
        title += " (quick: a smoke test)"

    def axes(ylabel: str) -> tuple[Any, Any]:
        figure, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent users")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        return figure, ax

    def xticks(ax: Any) -> None:
        levels = sorted({row["concurrency"] for _, rows in profiles for row in rows})
        if levels:
            ax.set_xticks(levels, [str(level) for level in levels])

    figure, ax = axes("time to first token (s, log scale)")
    ax.set_yscale("log")  # a document's seconds and a drafter's fractions of one on one chart
    for label, rows in profiles:
        xs = [row["concurrency"] for row in rows if row["ttft_p50_ms"] is not None]
        line = ax.plot(
            xs,
            [row["ttft_p50_ms"] / 1000 for row in rows if row["ttft_p50_ms"] is not None],
            marker="o",
            label=f"{label} p50",
        )
        ax.plot(
            xs,
            [row["ttft_p95_ms"] / 1000 for row in rows if row["ttft_p50_ms"] is not None],
            linestyle="--",
            marker="x",  # a level alone still shows its p95
            color=line[0].get_color(),
            label=f"{label} p95",
        )
    ax.axhline(sheet["targets"]["ttft_ms"] / 1000, color="grey", linestyle=":", label="target")
    xticks(ax)
    ax.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(ttft_path)
    plt.close(figure)

    figure, ax = axes("tokens/s per user (median)")
    for label, rows in profiles:
        points = [(row["concurrency"], row["tokens_per_s_per_user"]) for row in rows if row["tokens_per_s_per_user"]]
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label)
    ax.axhline(1000 / sheet["targets"]["itl_ms"], color="grey", linestyle=":", label="target (1 / ITL)")
    ceiling = (sheet.get("decode_ceiling") or {}).get("ceiling_tokens_per_s")
    if ceiling:
        ax.axhline(ceiling, color="black", linestyle="-.", label="decode ceiling, 1 user")
    xticks(ax)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(tokens_path)
    plt.close(figure)


def kv_shortfall(
    *,
    requests: dict[str, int],
    tokens_per_request: dict[str, int],
    in_flight_cap: dict[str, int],
    budget_tokens: int,
    document_budget_tokens: int,
) -> str | None:
    """Why the engine host's admission budget cannot hold a level's requests at once, or None.
    At most ``in_flight_cap`` requests of a kind run at once (its worker pool); the others wait in
    their queue and need no KV cache yet. Documents may use only ``document_budget_tokens``."""
    at_once = {kind: min(n, in_flight_cap.get(kind, n)) for kind, n in requests.items()}
    demand = {kind: at_once[kind] * tokens_per_request[kind] for kind in at_once}
    if demand.get("document", 0) > document_budget_tokens:
        return (
            f"{at_once['document']} document requests at once need {demand['document']:,} tokens of KV cache; "
            f"documents may use {document_budget_tokens:,}"
        )
    if sum(demand.values()) > budget_tokens:
        return (
            f"{sum(at_once.values())} requests at once need {sum(demand.values()):,} tokens of KV cache; "
            f"the admission budget is {budget_tokens:,}"
        )
    return None
