"""``manage.py bench``: one subcommand per benchmark of the ``measure`` app."""

import importlib

import pytest
from django.core.management import CommandError, call_command

from measure.management.commands.bench import BENCHMARKS, Command


def test_every_benchmark_is_a_subcommand_with_its_own_help_and_options(capsys):
    parser = Command().create_parser("manage.py", "bench")
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    listing = capsys.readouterr().out
    for name, path in BENCHMARKS.items():
        module = importlib.import_module(path)
        assert path.startswith("measure.")
        assert callable(module.add_arguments) and callable(module.run) and module.HELP
        assert name in listing and module.HELP.split()[0] in listing


def test_serving_takes_its_own_options():
    options = Command().create_parser("manage.py", "bench").parse_args(["serving", "--repeats", "2"])
    assert (options.benchmark, options.repeats) == ("serving", 2)


def test_an_unknown_benchmark_is_refused_with_the_names_there_are():
    with pytest.raises(CommandError, match="invalid choice: 'nothing'.*'ingest', 'scheduling', 'serving'"):
        call_command("bench", "nothing")
