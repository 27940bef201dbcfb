"""``manage.py specsheet --quick`` end to end: through the live web server's API, the workers'
queues and the engine host, with the real model; then the sheet's files, and the API serving it."""

from __future__ import annotations

import json
from io import StringIO

import httpx
import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from api.models import ApiToken
from api.services import token_create
from documents.models import Document
from inference.models import Job

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_the_quick_sheet_measures_every_profile_through_the_api(live_appliance, workers, engine_host):
    out = StringIO()
    call_command("specsheet", "--quick", "--url", live_appliance, stdout=out)
    printed = out.getvalue()
    assert f"measuring the appliance at {live_appliance}" in printed
    assert "document x 1: TTFT p50" in printed and "mixed x 2: TTFT p50" in printed  # progress as it runs

    folder = settings.VAR_DIR / "specsheet"
    sheet = json.loads((folder / "latest.json").read_text())
    assert sheet["quick"] is True
    assert sheet["model"]["name"] == engine_host.stats()["model"]
    assert sheet["engine"]["max_model_len"] == engine_host.stats()["max_model_len"]

    # Each level ran its users' requests to the end, with exactly the output asked for (the API's
    # ignore_eos), and the client counted every token (the deltas' token counts add up).
    expected_levels = {"document": [1, 2], "drafting": [1, 2], "mixed": [2]}
    outputs = {"document": 32, "drafting": 64}
    for name, levels in expected_levels.items():
        profile = sheet["profiles"][name]
        assert [row["concurrency"] for row in profile["levels"]] == levels
        for row in profile["levels"]:
            # (A job the appliance restarted, e.g. its worker's heartbeat missed on this busy test
            # machine, counts the tokens of its last attempt: the output below stays exact.)
            assert row["requests"] == row["concurrency"] and row["failed"] == 0, row
            assert row["ttft_p50_ms"] > 0 and row["itl_p50_ms"] > 0
            assert row["tokens_per_s_per_user"] > 0 and row["aggregate_tokens_per_s"] > 0
            if name != "mixed":
                assert row["output_tokens_mean"] == outputs[name]
                # Prompts of the length asked for, within the instruction's and template's tokens.
                assert abs(row["prompt_tokens_mean"] - profile["inputs"][name]) <= 0.1 * profile["inputs"][name]
    mixed = sheet["profiles"]["mixed"]["levels"][0]["by_kind"]
    assert mixed["document"]["output_tokens_mean"] == 32 and mixed["drafting"]["output_tokens_mean"] == 64

    answers = {a["key"]: a["answer"] for a in sheet["answers"]}
    assert len(answers) == 8
    assert answers["model"].startswith(f"{sheet['model']['name']}, licence {settings.APPLIANCE_MODEL_LICENCE}")
    assert f"{sheet['engine']['max_model_len']:,} tokens configured" in answers["context"]
    ceiling = sheet["decode_ceiling"]
    assert ceiling["ceiling_tokens_per_s"] > 0 and ceiling["bandwidth_source"].startswith("measured")
    assert ceiling["measured_tokens_per_s"] == sheet["profiles"]["drafting"]["levels"][0]["tokens_per_s_per_user"]

    # The files: the sheet as JSON and Markdown, two charts, all named in the sheet.
    assert json.loads((folder / sheet["files"]["json"]).read_text()) == sheet
    markdown = (folder / sheet["files"]["markdown"]).read_text()
    assert "A quick sheet is a smoke test" in markdown and answers["users"] in markdown
    for chart in sheet["charts"].values():
        assert (folder / chart).read_bytes()[:4] == b"\x89PNG"

    # The API serves the latest sheet.
    reader = get_user_model().objects.create_user(username="reader", password="a long password indeed")
    _, token = token_create(user=reader, name="read", scopes=["read"])
    engine = httpx.get(f"{live_appliance}/api/v1/engine", headers={"Authorization": f"Bearer {token}"}).json()
    assert engine["specsheet"]["started_at"] == sheet["started_at"]

    # Nothing of the run is left but the sheet: its account is switched off, its token revoked
    # (and it would have expired), its rows gone.
    account = get_user_model().objects.get(username="specsheet")
    assert not account.is_active and not account.has_usable_password()
    (used,) = ApiToken.objects.filter(user=account)
    assert used.revoked_at is not None and used.expires_at is not None and used.last_used_at is not None
    assert not Document.objects.filter(owner=account).exists() and not Job.objects.filter(owner=account).exists()


@pytest.mark.parametrize("staff", [False, True])
def test_a_persons_account_called_specsheet_is_left_alone(live_appliance, workers, engine_host, staff):
    person = get_user_model().objects.create_user(username="specsheet", password="a long password indeed")
    if staff:  # an administrator made without a password (createsuperuser --noinput) is a person too
        person.set_unusable_password()
        person.is_staff = person.is_superuser = True
        person.save()
    with pytest.raises(CommandError, match="A person's account is called 'specsheet'"):
        call_command("specsheet", "--quick", "--url", live_appliance, stdout=StringIO())
    person.refresh_from_db()
    assert person.is_active and person.is_staff == staff and not ApiToken.objects.filter(user=person).exists()
