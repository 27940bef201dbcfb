"""The sheet: the answers assembled from the measurements, written as JSON, Markdown and charts."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings

from inference import specsheet as sheet_
from measure.specsheet_run.hardware import hardware
from measure.specsheet_run.plan import _Plan


def _assemble(*, plan: _Plan, engine: dict, profiles: dict, bandwidth: tuple, started_at: datetime) -> dict[str, Any]:
    from inference.capacity import shape_of_model_dir

    finished_at = datetime.now(UTC)
    model_dir = Path(engine.get("model_path") or settings.APPLIANCE_MODEL)
    sheet: dict[str, Any] = {
        "version": sheet_.SHEET_VERSION,
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": finished_at.isoformat(timespec="seconds"),
        "duration_s": round((finished_at - started_at).total_seconds(), 1),
        "quick": plan.quick,
        "targets": {
            "ttft_ms": plan.targets.ttft_ms,
            "itl_ms": plan.targets.itl_ms,
            "min_goodput": plan.targets.min_goodput,
        },
        "model": {
            "name": engine.get("model") or model_dir.name,
            "licence": engine.get("licence") or settings.APPLIANCE_MODEL_LICENCE,
        },
        "engine": {
            key: engine.get(key)
            for key in (
                "dtype",
                "kv_cache_dtype",
                "max_model_len",
                "kv_capacity_tokens",
                "kv_block_size",
                "max_num_seqs",
                "max_num_batched_tokens",
                "scheduling",
                "vllm_version",
                "torch_version",
            )
        },  # fmt: skip
        "appliance": {
            "prefill_concurrency": settings.APPLIANCE_PREFILL_CONCURRENCY,
            "decode_concurrency": settings.APPLIANCE_DECODE_CONCURRENCY,
            "kv_safety_factor": engine.get("kv_safety_factor"),
            "kv_decode_reserve": engine.get("kv_decode_reserve_fraction"),
        },
        "hardware": hardware(engine),
        "topology": _topology(engine),
        "profiles": profiles,
    }
    drafting = profiles.get("drafting") or profiles.get("mixed")
    single = sheet_.level_at(profiles["drafting"]["levels"], 1) if "drafting" in profiles else None
    try:
        # The precisions the engine runs at (weights loaded as, KV cache stored as), not the config's.
        shape = shape_of_model_dir(
            model_dir,
            weight_dtype=engine.get("dtype") or None,
            kv_dtype=engine.get("kv_cache_dtype") or settings.APPLIANCE_KV_CACHE_DTYPE,
        )
        context = drafting["inputs"].get("drafting", 0) + drafting["outputs"].get("drafting", 0) // 2 if drafting else 0
        sheet["decode_ceiling"] = {
            **sheet_.decode_ceiling(
                bandwidth_bytes_per_s=bandwidth[0],
                weight_bytes=shape.weight_bytes,
                kv_bytes_per_token=shape.kv_bytes_per_token,
                context_tokens=context,
                measured_tokens_per_s=single["tokens_per_s_per_user"] if single else None,
            ),
            "bandwidth_source": bandwidth[1],
        }
    except (OSError, ValueError, KeyError):
        sheet["decode_ceiling"] = None
    sheet["answers"] = sheet_.answers(sheet)
    return sheet


def _topology(engine: dict) -> dict[str, Any]:
    """What the sheet was measured on (one engine, of some GPUs) and what this deployment runs:
    the engines per node and the nodes and engines the cluster view lists (none listed: this node
    alone)."""
    from appliance.broker import PUBLISH_ERRORS
    from appliance.cluster import nodes
    from inference.placement import cluster_engines

    try:
        listed = nodes()
    except PUBLISH_ERRORS:
        listed = []
    serving = [n for n in listed if {"prefill", "decode", "engine"} & set(n.get("roles", ()))]
    engines = {e.key for e in cluster_engines(listed)}
    return {
        "gpus_per_engine": int(engine.get("tensor_parallel_size") or 1),
        "engines_per_node": settings.APPLIANCE_ENGINES,
        "nodes": max(1, len(serving)),
        "engines": max(len(engines), settings.APPLIANCE_ENGINES),
    }


def _write(sheet: dict[str, Any]) -> list[Path]:
    out = Path(settings.VAR_DIR) / "specsheet"
    out.mkdir(parents=True, exist_ok=True)
    stem = f"specsheet-{datetime.fromisoformat(sheet['started_at']).strftime('%Y%m%dT%H%M%SZ')}"
    ttft, tokens = out / f"{stem}-ttft.png", out / f"{stem}-tokens-per-s.png"
    sheet["charts"] = {"ttft": ttft.name, "tokens_per_s": tokens.name}
    sheet["files"] = {"json": f"{stem}.json", "markdown": f"{stem}.md"}
    sheet_.draw_charts(sheet, ttft_path=ttft, tokens_path=tokens)
    (out / f"{stem}.md").write_text(sheet_.markdown(sheet), encoding="utf-8")
    body = json.dumps(sheet, indent=2) + "\n"
    (out / f"{stem}.json").write_text(body, encoding="utf-8")
    latest = out / "latest.json.tmp"
    latest.write_text(body, encoding="utf-8")
    latest.replace(out / "latest.json")  # the console and the API never read half a sheet
    return [out / f"{stem}.json", out / f"{stem}.md", ttft, tokens, out / "latest.json"]
