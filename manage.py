#!/usr/bin/env python
"""Django's command-line utility for the appliance."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "appliance.settings")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the appliance is air-gapped: never fetch weights
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
