"""What a debug page or ``diffsettings`` may show of the settings: Django hides names with KEY,
TOKEN, SECRET or PASS in them; the database and broker URLs carry the embedded services'
passwords too (``appliance/credentials.py``)."""

from __future__ import annotations

import re

from django.views.debug import SafeExceptionReporterFilter


class SecretsHiddenFilter(SafeExceptionReporterFilter):
    hidden_settings = re.compile("API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|URL", flags=re.IGNORECASE)
