"""``manage.py capacity``: weight memory, KV bytes per token and the most concurrent requests of a
context length on a device, from a model's shape; next to what the running engine reports.

    python manage.py capacity --memory-gib 80 --context 8192          # the served model
    python manage.py capacity --layers 32 --kv-heads 8 --head-dim 128 --params 8.03e9 \\
        --dtype bfloat16 --kv-dtype fp8 --memory-gib 24 --context 8192  # any other
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from inference.capacity import GIB, ShapeError


class Command(BaseCommand):
    help = "Plan KV-cache capacity: weights, KV bytes per token, concurrent requests at a context length."

    def add_arguments(self, parser):
        parser.add_argument(
            "--model-dir", help="a model directory (config.json + safetensors); default: the served model"
        )
        parser.add_argument("--layers", type=int)
        parser.add_argument("--kv-heads", type=int)
        parser.add_argument("--head-dim", type=int)
        parser.add_argument("--params", type=float, help="parameter count, e.g. 8.03e9")
        parser.add_argument("--dtype", default=None, help="weight dtype (default: the config's, or bfloat16)")
        parser.add_argument("--kv-dtype", default=None, help="KV-cache dtype (default: APPLIANCE_KV_CACHE_DTYPE)")
        parser.add_argument(
            "--memory-gib", type=float, help="device memory (default: the engine's GPU, or this machine's RAM)"
        )
        parser.add_argument(
            "--context", type=int, default=None, help="tokens per request (default: APPLIANCE_MAX_MODEL_LEN)"
        )
        parser.add_argument("--utilization", type=float, default=0.9, help="share of the device for weights + KV")
        parser.add_argument(
            "--gpus-per-engine",
            type=int,
            default=None,
            help="GPUs an engine spreads the model over (default: APPLIANCE_TENSOR_PARALLEL_SIZE)",
        )
        parser.add_argument("--engines", type=int, default=None,
                            help="engines in the cluster (default: those the nodes report)")  # fmt: skip
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **options):
        # The console's capacity page and GET /api/v1/capacity plan with the same defaults.
        from console import selectors

        manual = {"layers": "--layers", "kv_heads": "--kv-heads", "head_dim": "--head-dim", "parameters": "--params"}
        values = {name: options["params" if name == "parameters" else name] for name in manual}
        if not 0 < options["utilization"] <= 1:
            raise CommandError("--utilization must be more than 0 and at most 1")
        stats = selectors.engine()
        try:
            result = selectors.capacity_plan(
                **values,
                engine_stats=stats,
                weight_dtype=options["dtype"],
                kv_dtype=options["kv_dtype"],
                memory_bytes=int(options["memory_gib"] * GIB) if options["memory_gib"] else None,
                context_tokens=options["context"],
                memory_utilization=options["utilization"],
                gpus_per_engine=options["gpus_per_engine"],
                engines=options["engines"],
                model_dir=options["model_dir"],
            )
        except ShapeError as exc:
            if set(exc.fields) <= set(manual) and any(v is not None for v in values.values()):
                raise CommandError(f"{', '.join(manual.values())} go together; missing: "
                                   f"{', '.join(manual[f] for f in exc.fields)}") from None  # fmt: skip
            raise CommandError(f"{exc} ({exc.__cause__})" if exc.__cause__ else str(exc)) from None
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        served = not options["model_dir"] and all(v is None for v in values.values())
        engine = selectors.engine_capacity(stats if served else None)
        if options["json"]:
            self.stdout.write(json.dumps({**result.as_dict(), "engine": engine}, indent=2))
            return
        s = result.shape
        self.stdout.write(
            f"model shape      {s.layers} layers, {s.kv_heads} KV heads x {s.head_dim}, {s.parameters / 1e9:.2f} B parameters"
        )
        self.stdout.write(f"weights          {result.weight_bytes / 1e9:.2f} GB ({s.weight_dtype})")
        self.stdout.write(f"KV per token     {result.kv_bytes_per_token / 1024:.1f} KiB ({s.kv_dtype})")
        gpus = f"{result.gpus_per_engine} x " if result.gpus_per_engine > 1 else ""
        self.stdout.write(
            f"device memory    {gpus}{result.device_memory_bytes / GIB:.1f} GiB per engine, {result.memory_utilization:.0%} used"
        )
        self.stdout.write(
            f"KV budget        {result.kv_budget_bytes / GIB:.2f} GiB = {result.kv_capacity_tokens:,} tokens"
        )
        self.stdout.write(
            f"at {result.context_tokens:,} tokens    {result.max_concurrent_requests} concurrent requests per engine"
        )
        self.stdout.write(
            f"cluster          {result.engines} engine(s): {result.cluster_kv_capacity_tokens:,} KV tokens, "
            f"{result.cluster_max_concurrent_requests} concurrent requests"
        )
        if engine:
            self.stdout.write(
                f"engine reports   {engine.get('kv_capacity_tokens'):,} KV tokens ({engine.get('kv_cache_dtype')})"
            )
            if engine["planned_kv_capacity_tokens"] is not None:
                self.stdout.write(
                    f"planner there    {engine['planned_kv_capacity_tokens']:,} KV tokens in the same memory, whole blocks"
                )
        if not result.fits:
            self.stdout.write(self.style.ERROR(f"does not fit: {result.reason}"))
