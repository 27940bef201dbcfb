"""``manage.py bench <benchmark>``: the appliance's benchmarks, one subcommand each.

Each benchmark is a module of the ``measure`` app, named in ``BENCHMARKS`` below. The module
provides:

- ``HELP``: one line for ``bench --help``;
- ``add_arguments(parser)``: its own options;
- ``run(command, **options) -> dict``: runs it, writes progress and its table to
  ``command.stdout``, and returns the results, which this command saves as JSON under
  ``VAR_DIR/bench/<name>-<timestamp>.json``.

Benchmarks print ratios measured in one run on this machine, not absolute targets alone.
"""

from __future__ import annotations

import argparse
import importlib
import json
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from measure.benchmarking import sigterm_as_exit

# Subcommand -> module. A new benchmark is one more line here.
BENCHMARKS = {
    "cluster": "measure.bench_cluster",
    "ingest": "measure.bench_ingest",
    "scheduling": "measure.bench_scheduling",
    "serving": "measure.bench_serving",
}


class Command(BaseCommand):
    help = "Run one of the appliance's benchmarks; it prints a table and saves its results as JSON under var/bench/."

    def add_arguments(self, parser):
        subparsers = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
        self._modules: dict[str, ModuleType] = {}
        for name, path in BENCHMARKS.items():
            module = importlib.import_module(path)
            self._modules[name] = module
            subparser = subparsers.add_parser(
                name,
                help=getattr(module, "HELP", "").replace("%", "%%"),  # argparse formats help with %
                description=module.__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
            module.add_arguments(subparser)

    def handle(self, *args, benchmark: str, **options):
        module = self._modules.get(benchmark)
        if module is None:  # called as call_command("bench", ...) without the parser
            path = BENCHMARKS.get(benchmark)
            if path is None:
                raise CommandError(f"no benchmark called {benchmark!r}; there are: {', '.join(BENCHMARKS)}")
            module = importlib.import_module(path)
        started = datetime.now(UTC)
        with sigterm_as_exit():
            results = module.run(self, **options)
        document = {
            "benchmark": benchmark,
            "started_at": started.isoformat(),
            "finished_at": datetime.now(UTC).isoformat(),
            "results": results,
        }
        out_dir = Path(settings.VAR_DIR) / "bench"
        out_dir.mkdir(parents=True, exist_ok=True)
        saved = out_dir / f"{benchmark}-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
        saved.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
        self.stdout.write(f"\nresults saved to {saved}")
