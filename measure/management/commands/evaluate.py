"""``python manage.py evaluate``: summaries, clause extraction and drafted replies scored against
the gold set in ``measure/evaluation/data/`` (see ``measure.evaluation.run``)."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand

from measure.benchmarking import sigterm_as_exit
from measure.evaluation import run as evaluation


class Command(BaseCommand):
    help = (
        "Score the three tasks against the gold set through the real queues, workers and engine host, with the "
        "model APPLIANCE_MODEL names. Prints the figures and saves them as JSON under var/evaluate/."
    )

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        parser.epilog = evaluation.__doc__
        return parser

    def add_arguments(self, parser):
        evaluation.add_arguments(parser)

    def handle(self, *args, **options):
        started = datetime.now(UTC)
        with sigterm_as_exit():
            results = evaluation.run(self, **options)
        out_dir = Path(settings.VAR_DIR) / "evaluate"
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"evaluate-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
        document = {"started_at": started.isoformat(), "finished_at": datetime.now(UTC).isoformat(), **results}
        path.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
        self.stdout.write(f"\nresults saved to {path}")
