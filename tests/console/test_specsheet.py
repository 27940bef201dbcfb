"""``/console/specsheet``: the latest spec sheet ``manage.py specsheet`` wrote, its charts and its
downloads (staff only), and its summary on the console's overview."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client, override_settings

from console import selectors

pytestmark = pytest.mark.django_db

STAMP = "20261130T080000Z"
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 32  # enough of one for a test: only its bytes are compared


def level(concurrency, *, goodput, meets, ttft_p50_ms=1234.5, failed=0):
    return {
        "concurrency": concurrency, "requests": 2 * concurrency, "failed": failed, "ttft_p50_ms": ttft_p50_ms,
        "ttft_p95_ms": 1500.1, "itl_p50_ms": 33.1, "itl_p95_ms": 40.2, "tokens_per_s_per_user": 30.1,
        "aggregate_tokens_per_s": 29.9 * concurrency, "requests_per_s": 0.1, "goodput": goodput,
        "meets_target": meets, "wall_s": 20.0,
    }  # fmt: skip


def sample_sheet(*, quick=False) -> dict:
    return {
        "version": 1,
        "started_at": "2026-11-30T08:00:00+00:00",
        "finished_at": "2026-11-30T08:06:52+00:00",
        "duration_s": 412.3,
        "quick": quick,
        "targets": {"ttft_ms": 2000.0, "itl_ms": 100.0, "min_goodput": 0.9},
        "answers": [
            {
                "key": "model",
                "question": "Which model, under which licence?",
                "answer": "SmolLM2-135M-Instruct, licence Apache-2.0",
            },
            {
                "key": "precision",
                "question": "At what precision are the weights and the KV cache?",
                "answer": "weights bfloat16, KV cache bfloat16",
            },
            {"key": "users", "question": "How many users at once?", "answer": "2 drafting, 0 document"},
        ],
        "profiles": {
            "document": {
                "label": "Document",
                "description": "long input, short output: a summary job on the prefill queue",
                "input_tokens": 6144,
                "output_tokens": 256,
                "levels": [level(1, goodput=0.5, meets=False)],
                "users_served": 0,
                "stopped": "latency target: goodput 0.50 < 0.90 at 1 concurrent",
            },
            "drafting": {
                "label": "Drafting",
                "description": "short input, long output",
                "input_tokens": 512,
                "output_tokens": 512,
                "levels": [
                    level(1, goodput=1.0, meets=True),
                    level(2, goodput=1.0, meets=True),
                    level(4, goodput=0.0, meets=False, ttft_p50_ms=None, failed=8),
                ],
                "users_served": 2,
                "stopped": "all 8 requests failed at 4 concurrent",
            },
            "mixed": {
                "label": "Mixed",
                "description": "document and drafting users at once",
                "queue": "prefill + decode",
                "input_tokens": None,
                "output_tokens": None,
                "inputs": {"document": 6144, "drafting": 512},
                "outputs": {"document": 256, "drafting": 512},
                "requests_per_user": 2,
                "levels": [level(2, goodput=1.0, meets=True)],
                "users_served": 2,
                "stopped": "the top of the ladder (2)",
            },
        },
        "decode_ceiling": {
            "bandwidth_gb_s": 12.0,
            "bandwidth_source": "measured: a 512 MiB copy",
            "bytes_per_step": 280000000,
            "ceiling_tokens_per_s": 42.8,
            "measured_tokens_per_s": 30.1,
            "share_of_ceiling": 0.70,
        },
        "hardware": {
            "device": "cpu",
            "device_name": "x86_64",
            "device_memory_bytes": 25769803776,
            "cpus": 2,
            "driver": None,
            "vllm": "0.32.0",
            "torch": "2.13.0+cpu",
            "python": "3.11.2",
        },
        "charts": {"ttft": f"specsheet-{STAMP}-ttft.png", "tokens_per_s": f"specsheet-{STAMP}-tokens-per-s.png"},
        "files": {"json": f"specsheet-{STAMP}.json", "markdown": f"specsheet-{STAMP}.md"},
    }


def write_sheet(var_dir, sheet: dict) -> None:
    folder = var_dir / "specsheet"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "latest.json").write_text(json.dumps(sheet))
    (folder / f"specsheet-{STAMP}.json").write_text(json.dumps(sheet))
    (folder / f"specsheet-{STAMP}.md").write_text("# Spec sheet\n")
    (folder / f"specsheet-{STAMP}-ttft.png").write_bytes(PNG)


@pytest.fixture
def var_dir(tmp_path):
    with override_settings(VAR_DIR=tmp_path):
        yield tmp_path


def text(response) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode()))


def test_without_a_sheet_the_page_says_how_to_measure_one(staff_client, var_dir, monkeypatch):
    response = staff_client.get("/console/specsheet")
    assert response.status_code == 200 and response.context["sheet"] is None
    page = text(response)
    assert "python manage.py specsheet" in page and "python manage.py specsheet --quick" in page
    monkeypatch.setattr(selectors, "engine", lambda: None)
    assert 'id="console-specsheet"' not in staff_client.get("/console/").content.decode()  # no block either


def test_the_page_shows_the_answers_the_profiles_and_the_hardware(staff_client, var_dir):
    write_sheet(var_dir, sample_sheet())
    response = staff_client.get("/console/specsheet")
    assert response.status_code == 200
    html = response.content.decode()
    page = text(response)
    assert "Which model, under which licence? SmolLM2-135M-Instruct, licence Apache-2.0" in page
    assert "At what precision are the weights and the KV cache? weights bfloat16, KV cache bfloat16" in page
    assert '<time datetime="2026-11-30T08:00:00+00:00">30 Nov 2026 08:00 UTC</time>' in html
    assert "(6 min 52 s)" in page and "Run full" in page and "A quick sheet" not in page
    assert "time to first token ≤ 2 s, inter-token latency ≤ 100 ms, for at least 90 % of requests" in page
    # One table per profile, with users served and why the ramp stopped.
    document = html.split('id="specsheet-profile-document"')[1].split("</section>")[0]
    assert re.search(r'Users served within the targets: <span class="users-served">0</span>', document)
    assert "Stopped: latency target: goodput 0.50 &lt; 0.90 at 1 concurrent" in document
    assert "Long input, short output: a summary job on the prefill queue. 6,144 tokens in, 256 out" in document
    assert "1.23 / 1.50" in document and "33.1 / 40.2" in document and "50 %" in document
    mixed = text(response).split("Mixed", 2)[1]  # between its heading and its table
    assert "Document: 6,144 tokens in, 256 out per request; Drafting: 512 tokens in, 512 out per request." in mixed
    assert "Queue: prefill + decode. 2 requests per user at each level." in mixed
    drafting = html.split('id="specsheet-profile-drafting"')[1].split("</section>")[0]
    assert '<span class="users-served">2</span>' in drafting
    rows = re.findall(r"<tr>(.*?)</tr>", drafting, flags=re.S)[1:]  # after the header row
    assert len(rows) == 3
    assert ">yes<" in rows[0] and "100 %" in rows[0]
    assert "— / 1.50" in rows[2] and ">8<" in rows[2] and ">no<" in rows[2]  # all failed: no TTFT p50
    assert "12.0 GB/s (measured: a 512 MiB copy)" in page and "280 MB" in page
    assert "30.1 tokens/s, 70 % of the ceiling" in page
    assert "Device memory 24.0 GiB" in page and "vLLM 0.32.0" in page and "Driver" not in page
    # Charts with alt text, and the downloads, through the file view.
    assert f'<img src="/console/specsheet/files/specsheet-{STAMP}-ttft.png" alt="Chart: time to first token' in html
    assert f'href="/console/specsheet/files/specsheet-{STAMP}.md" download' in html
    assert f'href="/console/specsheet/files/specsheet-{STAMP}.json" download' in html


def test_a_quick_sheet_says_it_is_a_smoke_test(staff_client, var_dir):
    write_sheet(var_dir, sample_sheet(quick=True))
    page = text(staff_client.get("/console/specsheet"))
    assert "A quick sheet ( --quick ): a smoke test" in page and "not figures to quote" in page


def test_a_sheet_with_nulls_and_missing_parts_still_renders(staff_client, var_dir):
    sheet = sample_sheet()
    sheet["decode_ceiling"] = {key: None for key in sheet["decode_ceiling"]}
    sheet["profiles"]["document"]["levels"] = [{"concurrency": 1, "ttft_p50_ms": None, "goodput": None}]
    sheet["profiles"]["mixed"] = {"users_served": None}
    del sheet["answers"], sheet["hardware"], sheet["targets"], sheet["finished_at"]
    sheet["charts"] = {"ttft": "../../secret_key", "tokens_per_s": None}
    sheet["started_at"] = "yesterday morning"
    write_sheet(var_dir, sheet)
    response = staff_client.get("/console/specsheet")
    assert response.status_code == 200
    html = response.content.decode()
    assert "yesterday morning" in html and "secret_key" not in html and "<img" not in html
    assert 'id="specsheet-profile-mixed"' in html
    (var_dir / "specsheet" / "latest.json").write_text("[1, 2")  # half written
    assert staff_client.get("/console/specsheet").context["sheet"] is None


def test_the_file_view_serves_only_the_sheets_own_files(staff_client, var_dir):
    write_sheet(var_dir, sample_sheet())
    (var_dir / "secret_key").write_text("do not serve me")
    png = staff_client.get(f"/console/specsheet/files/specsheet-{STAMP}-ttft.png")
    assert png.status_code == 200 and png["Content-Type"] == "image/png"
    assert b"".join(png.streaming_content) == PNG and "attachment" not in png.get("Content-Disposition", "")
    markdown = staff_client.get(f"/console/specsheet/files/specsheet-{STAMP}.md")
    assert markdown.status_code == 200 and markdown["Content-Type"].startswith("text/markdown")
    assert markdown["Content-Disposition"] == f'attachment; filename="specsheet-{STAMP}.md"'
    figures = staff_client.get(f"/console/specsheet/files/specsheet-{STAMP}.json")
    assert figures["Content-Type"] == "application/json" and figures["Content-Disposition"].startswith("attachment")
    assert json.loads(b"".join(figures.streaming_content))["version"] == 1
    for name in (
        "../secret_key", "..%2Fsecret_key", "%2e%2e%2fsecret_key", "latest.json", "secret_key",
        f"specsheet-{STAMP}.txt", "specsheet-20990101T000000Z.png",  # a valid name of no file
        f"specsheet-{STAMP}.md%0A", f"..%2F..%2Fspecsheet%2Fspecsheet-{STAMP}.md",
    ):  # fmt: skip
        assert staff_client.get(f"/console/specsheet/files/{name}").status_code == 404, name
    assert selectors.specsheet_file(f"specsheet-{STAMP}.md\n") is None
    assert selectors.specsheet_file(f"../specsheet/specsheet-{STAMP}.md") is None


def test_the_overview_shows_users_served_per_profile_with_a_link(staff_client, var_dir, monkeypatch):
    monkeypatch.setattr(selectors, "engine", lambda: None)
    write_sheet(var_dir, sample_sheet())
    response = staff_client.get("/console/")
    block = response.content.decode().split('id="console-specsheet"')[1].split("</section>")[0]
    assert "Document: <strong>0</strong>" in block and "Drafting: <strong>2</strong>" in block
    assert "Mixed: <strong>2</strong>" in block
    assert 'href="/console/specsheet"' in block and "08:06" in block  # when it finished


def test_the_engine_api_still_carries_the_latest_sheet(alice, var_dir):
    from api.services import token_create

    write_sheet(var_dir, sample_sheet())
    _, raw = token_create(user=alice, name="tool", scopes=["read"])
    body = Client().get("/api/v1/engine", HTTP_AUTHORIZATION=f"Bearer {raw}").json()
    assert body["specsheet"]["profiles"]["drafting"]["users_served"] == 2


def test_software_versions_are_for_staff_only(alice, django_user_model, var_dir, monkeypatch):
    from api.services import token_create

    stats = {"model": "SmolLM2", "licence": "Apache-2.0", "vllm_version": "0.32.0", "torch_version": "2.13.0"}
    monkeypatch.setattr(selectors, "engine", lambda: stats)
    sheet = sample_sheet()
    sheet["hardware"] = {**sheet.get("hardware", {}), "device": "cpu", "cpu": "EPYC", "cpus": 2, "ram_bytes": 2**34,
                         "driver": None, "cuda": None, "vllm": "0.32.0", "torch": "2.13.0", "python": "3.11.7",
                         "platform": "Linux-6.18"}  # fmt: skip
    write_sheet(var_dir, sheet)
    _, raw = token_create(user=alice, name="tool", scopes=["read"])
    body = Client().get("/api/v1/engine", HTTP_AUTHORIZATION=f"Bearer {raw}").json()
    assert body["model"] == "SmolLM2" and body["vllm_version"] is None and body["torch_version"] is None
    text = json.dumps(body)
    assert "0.32.0" not in text and "2.13.0" not in text and "3.11.7" not in text and "Linux-6.18" not in text
    assert body["specsheet"]["hardware"]["cpu"] == "EPYC"  # the hardware stays: a buyer's question
    staff = django_user_model.objects.create_user(username="root", password="x" * 20, is_staff=True)
    _, admin_raw = token_create(user=staff, name="ops", scopes=["read"])
    staff_body = Client().get("/api/v1/engine", HTTP_AUTHORIZATION=f"Bearer {admin_raw}").json()
    assert staff_body["vllm_version"] == "0.32.0" and staff_body["specsheet"]["hardware"]["python"] == "3.11.7"
