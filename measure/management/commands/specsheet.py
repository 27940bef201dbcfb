"""``python manage.py specsheet``: see ``measure.specsheet_run``."""

from __future__ import annotations

import argparse

from django.core.management.base import BaseCommand

from measure import specsheet_run


class Command(BaseCommand):
    help = (
        "Measure this appliance through its API, queues and engine host (document, drafting and mixed workloads "
        "at rising concurrency) and write the spec sheet that answers the eight questions a buyer should ask, "
        "under var/specsheet/."
    )

    def create_parser(self, prog_name, subcommand, **kwargs):
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        parser.epilog = specsheet_run.__doc__
        return parser

    def add_arguments(self, parser):
        specsheet_run.add_arguments(parser)

    def handle(self, *args, **options):
        specsheet_run.run(self, **options)
