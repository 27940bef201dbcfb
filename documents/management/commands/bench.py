"""``manage.py bench <benchmark>``: the appliance's benchmarks, one subcommand each.

A benchmark is a module named ``bench_<name>`` in an app of this project, at the app's top level
or in its ``measure`` package (``documents/bench_ingest.py`` is ``bench ingest``,
``inference/measure/bench_scheduling.py`` would be ``bench scheduling``). Adding one needs no
change here. The module provides:

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
import importlib.util
import json
import pkgutil
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

from django.apps import apps
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from appliance.benchmarking import sigterm_as_exit

MODULE_PREFIX = "bench_"


def benchmark_modules() -> dict[str, str]:
    """Benchmark name -> dotted module path, for every ``bench_<name>`` module of the project's apps."""
    found: dict[str, str] = {}
    base_dir = Path(settings.BASE_DIR).resolve()
    for app_config in apps.get_app_configs():
        if base_dir not in Path(app_config.path).resolve().parents:
            continue  # Django's own apps and third-party ones
        for package in (app_config.name, f"{app_config.name}.measure"):
            spec = importlib.util.find_spec(package) if _parent_importable(package) else None
            if spec is None or not spec.submodule_search_locations:
                continue
            for module in pkgutil.iter_modules(spec.submodule_search_locations):
                if module.name.startswith(MODULE_PREFIX) and not module.ispkg:
                    name = module.name.removeprefix(MODULE_PREFIX)
                    path = f"{package}.{module.name}"
                    if name in found:
                        raise CommandError(f"two benchmarks are called {name!r}: {found[name]} and {path}")
                    found[name] = path
    return dict(sorted(found.items()))


def _parent_importable(package: str) -> bool:
    parent = package.rpartition(".")[0]
    return not parent or importlib.util.find_spec(parent) is not None


class Command(BaseCommand):
    help = "Run one of the appliance's benchmarks; it prints a table and saves its results as JSON under var/bench/."

    def add_arguments(self, parser):
        subparsers = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
        self._modules: dict[str, ModuleType] = {}
        for name, path in benchmark_modules().items():
            module = importlib.import_module(path)
            self._modules[name] = module
            subparser = subparsers.add_parser(
                name,
                help=getattr(module, "HELP", ""),
                description=module.__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
            module.add_arguments(subparser)

    def handle(self, *args, benchmark: str, **options):
        module = self._modules.get(benchmark)
        if module is None:  # called as call_command("bench", ...) without the parser
            path = benchmark_modules().get(benchmark)
            if path is None:
                raise CommandError(f"no benchmark called {benchmark!r}; there are: {', '.join(benchmark_modules())}")
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
        path = out_dir / f"{benchmark}-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
        path.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
        self.stdout.write(f"\nresults saved to {path}")
