"""A person in real headless Chromium: sign in, upload a PDF, watch it become ready, summarise
it and see the text stream into the page with its TTFT and tokens/s. Screenshots go to
``var/screenshots/``. Uses Debian's ``chromium`` (Playwright's own browser download is not
available on these machines)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from tests.pdfs import CONTRACT_PAGES, make_pdf

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).resolve().parent.parent / "var" / "screenshots"
PASSWORD = "a long and careful password"


@pytest.fixture
def page(monkeypatch):
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is not installed; .ci/run installs it (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    # Playwright's sync API keeps an event loop in this thread; the test's own ORM calls are
    # ordinary blocking calls all the same.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"],
        )
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        yield context.new_page()
        context.close()
        browser.close()


def test_sign_in_upload_and_watch_a_summary_stream(page, live_appliance, workers, engine_host, tmp_path):
    get_user_model().objects.create_user(username="carol", password=PASSWORD)
    pdf = tmp_path / "services-agreement.pdf"
    pdf.write_bytes(make_pdf(CONTRACT_PAGES, title="Services agreement"))

    page.goto(f"{live_appliance}/")
    page.get_by_label("Username").fill("carol")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in", exact=True).click()
    page.wait_for_url("**/documents/")

    page.get_by_label("Upload files").set_input_files(str(pdf))
    page.get_by_role("button", name="Upload", exact=True).click()
    page.get_by_text("uploaded; its text is being extracted").wait_for()
    page.get_by_role("link", name="Services agreement").click()
    # The page polls the document's state and reloads itself when it is ready.
    page.get_by_role("button", name="Summarise", exact=True).wait_for(timeout=120_000)
    assert page.locator("#page-2").inner_text().count("4,800 pounds") == 1
    page.screenshot(path=str(SCREENSHOTS / "document-ready.png"), full_page=True)

    # Record every change of the output as it happens, to tell streaming from one late update.
    page.add_init_script(
        """
        window.__timeline = [];
        document.addEventListener("DOMContentLoaded", () => {
          const out = document.getElementById("job-output");
          if (!out) return;
          new MutationObserver(() => window.__timeline.push({
            chars: out.textContent.length,
            state: document.getElementById("job-state").textContent.trim(),
          })).observe(out, {childList: true, characterData: true, subtree: true});
        });
        """
    )
    page.get_by_label("Length").select_option("short")
    page.get_by_role("button", name="Summarise", exact=True).click()
    page.wait_for_url("**/jobs/**")
    output = page.locator("#job-output")
    page.wait_for_function("() => document.getElementById('job-output').textContent.trim().length > 0", timeout=600_000)
    page.screenshot(path=str(SCREENSHOTS / "summary-streaming.png"), full_page=True)
    page.wait_for_function("() => document.getElementById('job-state').textContent.trim() === 'Done'", timeout=600_000)
    page.screenshot(path=str(SCREENSHOTS / "summary-done.png"), full_page=True)
    assert len(output.inner_text().split()) >= 5
    # The text grew in several steps while the job was running: it streamed.
    timeline = page.evaluate("window.__timeline")
    growing = [entry["chars"] for entry in timeline if entry["state"] == "Running"]
    assert len(set(growing)) >= 3, timeline
    assert page.locator('[data-metric="ttft_ms"]').inner_text().endswith(" ms")
    assert float(page.locator('[data-metric="decode_tokens_per_s"]').inner_text()) > 0

    # What the page streamed is what the appliance stored.
    from inference.models import Job

    job = Job.objects.get(owner__username="carol")
    assert job.state == Job.State.SUCCEEDED
    assert output.inner_text().strip() == job.result_text
    # Each statement with the page it comes from, shown when the job finished.
    statements = job.result_data["statements"]
    assert statements and page.locator("#job-sources li").count() == len(statements)
    for statement in statements:
        assert statement["page"] is None or 1 <= statement["page"] <= len(CONTRACT_PAGES)
    linked = [s for s in statements if s["page"]]
    assert page.locator("#job-sources li a").count() == len(linked)


def test_draft_a_reply_with_citations_and_open_a_cited_page(page, live_appliance, workers, engine_host):
    from inference.models import Job
    from tests.factories import ready_document

    dora = get_user_model().objects.create_user(username="dora", password=PASSWORD)
    lease = ready_document(
        dora,
        "Flat lease",
        [
            "Section 4. The rent is 1,850 euros a month, payable in advance on the first working day of each month.",
            "Section 9. The tenant may end the lease at any time with three months' notice in writing to the "
            "landlord's managing agent, Harbour Estates, at 12 Quay Street.",
        ],
    )
    page.goto(f"{live_appliance}/")
    page.get_by_label("Username").fill("dora")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in", exact=True).click()
    page.wait_for_url("**/documents/")

    page.get_by_role("link", name="Draft a reply", exact=True).click()
    page.get_by_label("The message to reply to").fill(
        "Dear Harbour Estates, how much notice must I give to end my lease, and where do I send it? Sam Porter"
    )
    page.get_by_label("These documents (optional)").select_option(str(lease.pk))
    page.get_by_label("Tone").select_option("friendly")
    page.get_by_label("Length").select_option("short")
    page.get_by_role("button", name="Draft the reply").click()
    page.wait_for_url("**/jobs/**")
    # The draft streams, then the page reloads with each sentence checked and the passages listed.
    page.locator("#draft-text").wait_for(timeout=600_000)
    page.screenshot(path=str(SCREENSHOTS / "draft-done.png"), full_page=True)
    job = Job.objects.get(owner=dora)
    passages = job.result_data["passages"]
    assert page.locator(".passages li").count() == len(passages) >= 1
    assert page.locator("#draft-text .sentence").count() == len(job.result_data["sentences"])
    assert page.locator("#draft-text .flag").count() == job.result_data["support"]["unsupported"]
    # Each passage links to its page of the document; follow the first.
    first = page.locator(f"#passage-{passages[0]['number']} a")
    assert first.inner_text() == f"Flat lease, p. {passages[0]['page_start']}"
    first.click()
    page.wait_for_url(f"**/documents/{lease.pk}/#page-{passages[0]['page_start']}")
    assert page.locator(f"#page-{passages[0]['page_start']}").is_visible()
