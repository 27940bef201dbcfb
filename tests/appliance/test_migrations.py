"""Every model change comes with its migration (what ``makemigrations --check`` says in CI)."""

from io import StringIO

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_the_models_and_their_migrations_agree():
    out = StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit:
        pytest.fail(f"a model changed without its migration (run manage.py makemigrations):\n{out.getvalue()}")
    assert "No changes detected" in out.getvalue()
