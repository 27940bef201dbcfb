"""A person in real headless Chromium: sign in, upload a PDF, watch it become ready, summarise
it and see the text stream into the page with its TTFT and tokens/s. Screenshots go to
``var/screenshots/``. Uses Debian's ``chromium`` (Playwright's own browser download is not
available on these machines)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from tests.conftest import wait_until
from tests.pdfs import CONTRACT_PAGES, make_pdf

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).resolve().parent.parent / "var" / "screenshots"
PASSWORD = "a long and careful password"


@pytest.fixture
def page(monkeypatch):
    if not Path(CHROMIUM).exists():
        pytest.fail(
            "Debian's chromium is not installed; make test installs it (scripts/system-packages), or: apt-get install chromium"
        )
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
            text: out.textContent,
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
    streamed = [entry["text"] for entry in timeline if entry["state"] == "Running"][-1]
    assert streamed.strip() == job.result_text
    # Once done, the text is shown as sanitised Markdown (the same words, no raw markup).
    assert "rendered" in output.get_attribute("class")
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


def _sign_in(page, live_appliance, username: str) -> None:
    page.goto(f"{live_appliance}/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in", exact=True).click()
    page.wait_for_url("**/documents/")


def test_an_administrator_reads_the_console_and_others_get_none(page, live_appliance):
    User = get_user_model()
    from documents.models import Document

    User.objects.create_user(username="root", password=PASSWORD, is_staff=True, is_superuser=True)
    gina = User.objects.create_user(username="gina", password=PASSWORD)
    memo = Document.objects.create(
        owner=gina, title="Board memo", filename="memo.txt", size_bytes=1, sha256="b" * 64,
        state=Document.State.READY, pages_total=1,
    )  # fmt: skip

    _sign_in(page, live_appliance, "gina")
    page.goto(f"{live_appliance}/documents/{memo.pk}/")  # read: the audit log will say so
    assert page.get_by_role("link", name="Console").count() == 0
    response = page.goto(f"{live_appliance}/console/")
    assert response.status == 403
    page.get_by_role("heading", name="Staff only").wait_for()
    page.get_by_role("button", name="Sign out gina").click()

    _sign_in(page, live_appliance, "root")
    page.get_by_role("link", name="Console").click()
    page.wait_for_url("**/console/")
    for heading in ("Engine", "Queues", "Failures", "Usage per user, last 30 days"):
        page.get_by_role("heading", name=heading).wait_for()
    page.screenshot(path=str(SCREENSHOTS / "console.png"), full_page=True)
    page.get_by_role("link", name="Audit log").click()
    page.wait_for_url("**/console/audit")
    rows = page.locator("#audit-table tbody tr")
    assert rows.count() == 1  # gina read her memo; a refused visit to the console is no event
    assert "gina" in rows.first.inner_text() and "read" in rows.first.inner_text()
    assert "Board memo" in rows.first.inner_text()
    page.screenshot(path=str(SCREENSHOTS / "console-audit.png"), full_page=True)


def test_drop_two_files_watch_them_become_ready_then_cancel_a_long_summary(page, live_appliance, workers, engine_host):
    get_user_model().objects.create_user(username="hana", password=PASSWORD)
    _sign_in(page, live_appliance, "hana")
    long_text = "\f".join(
        " ".join(f"Page {n}, clause {i}: the tenant pays {n * 100 + i} pounds on day {i}." for i in range(60))
        for n in range(1, 13)
    )
    files = [["short-note.txt", "A short note about the lift inspection on 3 March."], ["long-lease.txt", long_text]]
    transfer = page.evaluate_handle(
        """(files) => {
          const transfer = new DataTransfer();
          for (const [name, text] of files) transfer.items.add(new File([text], name, {type: "text/plain"}));
          return transfer;
        }""",
        files,
    )
    page.dispatch_event("[data-dropzone]", "drop", {"dataTransfer": transfer})
    page.get_by_text("short-note.txt uploaded").wait_for()
    page.get_by_text("long-lease.txt uploaded").wait_for()
    page.screenshot(path=str(SCREENSHOTS / "library-uploading.png"), full_page=True)
    # The library follows each document's state and shows the new one when both are ready.
    page.wait_for_function(
        "() => document.querySelectorAll('.state-ready').length === 2", timeout=300_000, polling=1000
    )
    page.screenshot(path=str(SCREENSHOTS / "library-ready.png"), full_page=True)

    page.get_by_role("link", name="long-lease").click()
    page.get_by_role("button", name="Summarise", exact=True).click()
    page.wait_for_url("**/jobs/**")
    page.get_by_role("button", name="Cancel").click()
    page.get_by_text("The job was cancelled.").wait_for()
    assert page.locator("#job-state").inner_text() == "Cancelled"
    page.screenshot(path=str(SCREENSHOTS / "job-cancelled.png"), full_page=True)
    page.get_by_role("link", name="Jobs", exact=True).click()
    row = page.locator("#jobs-table tbody tr").first
    assert "Cancelled" in row.inner_text()
    row.get_by_role("button", name="Retry summary").click()
    page.wait_for_url("**/jobs/**")
    from inference.models import Job

    assert Job.objects.filter(owner__username="hana").count() == 2
    page.get_by_role("button", name="Cancel").click()  # the retried job too: it would run for minutes


def test_extract_clauses_and_open_one_at_its_page(page, live_appliance, workers, engine_host):
    from measure.evaluation.gold import load_gold_set
    from tests.factories import ready_document

    ivan = get_user_model().objects.create_user(username="ivan", password=PASSWORD)
    lease = ready_document(ivan, "Commercial lease", list(load_gold_set().documents["contract-03"].pages))
    _sign_in(page, live_appliance, "ivan")
    page.goto(f"{live_appliance}/documents/{lease.pk}/")
    page.get_by_role("button", name="Extract clauses").click()
    page.wait_for_url("**/jobs/**")
    page.get_by_role("heading", name="Clauses found").wait_for(timeout=600_000)  # the page reloads when done
    page.screenshot(path=str(SCREENSHOTS / "clauses.png"), full_page=True)
    first = page.locator("article.clause").first
    quote = first.locator("mark").inner_text()
    link = first.get_by_role("link")
    number = link.inner_text().removeprefix("page ")
    link.click()
    page.wait_for_url(f"**/documents/{lease.pk}/#page-{number}")
    assert quote in page.locator(f"#page-{number}").inner_text()  # the quote is that page's own text


AXE_FAILING_IMPACTS = {"serious", "critical"}


def _accessibility_violations(page) -> list[str]:
    """axe-core's serious and critical findings on the page as it is now (WCAG 2.1 A and AA)."""
    import axe_playwright_python

    # Evaluated, not added as a <script>: the pages' Content-Security-Policy allows no inline script
    # (evaluation from the test's side is not subject to it; the page's own scripts still are).
    page.evaluate((Path(axe_playwright_python.__file__).parent / "axe.min.js").read_text())
    result = page.evaluate(
        "async () => await axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', "
        "'wcag21aa']}, resultTypes: ['violations']})"
    )
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']][:3]}"
        for v in result["violations"]
        if v["impact"] in AXE_FAILING_IMPACTS
    ]


def test_upload_a_folder_of_contracts_as_a_batch_follow_it_and_cancel_it(page, live_appliance, workers):
    from documents.models import Batch, Chunk, Document

    get_user_model().objects.create_user(username="kim", password=PASSWORD)
    _sign_in(page, live_appliance, "kim")
    cuad = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "cuad-dev" / "pdf"
    files = [Path("/usr/share/common-licenses/BSD"), *(cuad / f"dev-{n:02d}.pdf" for n in (2, 3, 17, 9))]
    page.set_input_files(
        "#id_files",
        [{"name": f"{p.name}.txt" if not p.suffix else p.name, "mimeType": "application/octet-stream",
          "buffer": p.read_bytes()} for p in files],
    )  # fmt: skip
    page.get_by_role("button", name="Upload", exact=True).click()
    page.wait_for_url("**/documents/batches/*/")
    batch = Batch.objects.get(owner__username="kim")
    # The page follows the batch by itself (htmx): files are read, and the rate measured. (Two
    # may finish between two of its polls: "1 done" alone was never shown in one slow run.)
    page.locator("[data-field=files]").get_by_text(re.compile(r"^[1-9]\d* done")).wait_for(timeout=300_000)
    assert "not measured yet" not in page.locator("[data-field=rate]").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "batch-running.png"), full_page=True)
    page.get_by_role("button", name="Cancel the batch").click()
    page.get_by_text("Batch cancelled").wait_for()
    page.locator("[data-field=state]").get_by_text("Cancelled").wait_for()
    page.screenshot(path=str(SCREENSHOTS / "batch-cancelled.png"), full_page=True)
    done = Document.objects.filter(batch=batch, state=Document.State.READY)
    assert done.exists() and not done.exclude(pk__in=Chunk.objects.values("document")).exists()
    # The worker reads a few files at once: those it finished stay done, every other one is
    # cancelled (waiting, or stopped while read) with nothing of it searchable.
    wait_until(lambda: Batch.objects.filter(pk=batch.pk, finished_at__isnull=False).exists(), timeout_s=300,
               message="the cancelled batch's files being read to stop")  # fmt: skip
    states = dict(Document.objects.filter(batch=batch).values_list("pk", "state"))
    assert set(states.values()) <= {Document.State.READY, Document.State.CANCELLED}
    cancelled = [pk for pk, state in states.items() if state == Document.State.CANCELLED]
    assert cancelled and not Chunk.objects.filter(document__in=cancelled).exists()


def test_every_page_passes_an_accessibility_check(page, live_appliance):
    from django.utils import timezone

    from documents.models import Batch, Document, Page
    from inference.models import Job, JobKind, Queue

    jo = get_user_model().objects.create_user(username="jo", password=PASSWORD, is_staff=True, is_superuser=True)
    document = Document.objects.create(
        owner=jo, title="Lift contract", filename="lift.txt", size_bytes=1, sha256="c" * 64,
        state=Document.State.READY, pages_total=1, pages_done=1,
    )  # fmt: skip
    Page.objects.create(document=document, number=1, text="The contractor services the lifts every month.")
    batch = Batch.objects.create(
        owner=jo, name="contracts.zip", files_total=3, files_skipped=1,
        skipped=[{"name": "contracts/../x.txt", "reason": "Its name climbs out of the folder: refused."}],
    )  # fmt: skip
    Document.objects.filter(pk=document.pk).update(batch=batch)
    waiting = Document.objects.create(
        owner=jo, title="Boiler contract", filename="boiler.txt", size_bytes=1, sha256="d" * 64, batch=batch,
    )  # fmt: skip
    job = Job.objects.create(
        owner=jo, kind=JobKind.SUMMARISE, queue=Queue.PREFILL, state=Job.State.SUCCEEDED, document=document,
        result_text="The lifts are **serviced monthly** (p. 1).", finished_at=timezone.now(),
        result_data={"statements": [{"text": "The lifts are serviced monthly (p. 1).", "page": 1, "similarity": 0.8,
                                     "source": "model"}]},
    )  # fmt: skip
    page.goto(f"{live_appliance}/accounts/login/")
    assert _accessibility_violations(page) == [], "login"
    # The check sees what it should: a field without a label is a critical finding.
    page.evaluate("document.querySelector('form').insertAdjacentHTML('beforeend', '<input id=unlabelled>')")
    assert any(v.startswith("label (critical)") for v in _accessibility_violations(page))
    _sign_in(page, live_appliance, "jo")
    found = {}
    for path in (
        "/documents/", f"/documents/{document.pk}/", "/documents/search?q=lifts", "/draft", "/jobs/",
        "/documents/batches/", f"/documents/batches/{batch.pk}/", f"/documents/{waiting.pk}/",
        f"/jobs/{job.pk}/", "/console/", "/console/audit", "/console/capacity", "/console/specsheet",
        "/console/capacity?layers=80&kv_heads=8&head_dim=128&parameters=70.6e9&memory_gib=24",  # does not fit
        "/console/capacity?layers=32&memory_gib=0",  # errors in the form
    ):  # fmt: skip
        page.goto(f"{live_appliance}{path}")
        found[path] = _accessibility_violations(page)
    assert found == {path: [] for path in found}


def test_a_spec_sheet_passes_the_accessibility_check(page, live_appliance, tmp_path):
    """The spec sheet page with a sheet in it. The web server reads its sheet from the test
    suite's shared ``var/``, so the page is rendered here from a sheet in a folder of this test's
    own and handed to the browser in place of the server's answer (its styles come from the server)."""
    from django.test import Client, override_settings

    from tests.console.test_specsheet import sample_sheet, write_sheet

    jo = get_user_model().objects.create_user(username="jo", password=PASSWORD, is_staff=True)
    write_sheet(tmp_path, sample_sheet(quick=True))
    client = Client()
    client.force_login(jo)
    with override_settings(VAR_DIR=tmp_path):
        html = client.get("/console/specsheet").content.decode()
    assert 'id="specsheet-profile-drafting"' in html
    _sign_in(page, live_appliance, "jo")
    page.route(
        f"{live_appliance}/console/specsheet",
        lambda route: route.fulfill(status=200, content_type="text/html; charset=utf-8", body=html),
    )
    page.route(
        f"{live_appliance}/console/specsheet/files/*",
        lambda route: route.fulfill(status=200, content_type="image/png", path=str(next(tmp_path.rglob("*.png")))),
    )
    page.goto(f"{live_appliance}/console/specsheet")
    page.get_by_role("heading", name="Drafting").wait_for()
    assert _accessibility_violations(page) == []
    page.screenshot(path=str(SCREENSHOTS / "console-specsheet.png"), full_page=True)


def test_create_a_token_see_it_once_copy_it_and_revoke_it(page, live_appliance):
    import hashlib

    from api.models import ApiToken

    kim = get_user_model().objects.create_user(username="kim", password=PASSWORD)
    _sign_in(page, live_appliance, "kim")
    page.get_by_role("link", name="API tokens").click()
    page.wait_for_url("**/account/tokens/")
    assert page.get_by_label("Date (the token stops working at the start of this day)").is_hidden()  # until chosen
    page.get_by_label("Name").fill("Case system")
    page.get_by_label("write: upload, share, delete", exact=False).check()
    page.get_by_label("Expires").select_option("30")
    page.get_by_role("button", name="Create token").click()

    page.get_by_role("heading", name="Copy your new token now").wait_for()
    raw = page.get_by_label("Token “Case system”").input_value()
    token = ApiToken.objects.get(user=kim)
    assert hashlib.sha256(raw.encode()).hexdigest() == token.token_sha256
    assert token.scopes == ["read", "write"]
    # The copy button (shown by the page's script) puts the token on the clipboard.
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_appliance)
    page.get_by_role("button", name="Copy", exact=True).click()
    page.get_by_text("Copied.").wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == raw
    page.screenshot(path=str(SCREENSHOTS / "api-tokens.png"), full_page=True)
    assert _accessibility_violations(page) == []

    page.reload()  # a GET (the page made it one): the token is not shown again, nor a new one made
    assert raw not in page.content() and ApiToken.objects.filter(user=kim).count() == 1
    assert page.get_by_role("heading", name="Copy your new token now").count() == 0
    row = page.locator(f'#tokens-table tr[data-token-id="{token.pk}"]')
    assert f"{token.prefix}…" in row.inner_text() and "Active" in row.inner_text()

    page.once("dialog", lambda dialog: dialog.accept())  # "Revoke “Case system”? …"
    row.get_by_role("button", name="Revoke Case system").click()
    page.get_by_text("is revoked; requests with it now fail").wait_for()
    assert row.locator('[data-field="status"]').inner_text() == "Revoked"
    assert row.get_by_role("button").count() == 0
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert _accessibility_violations(page) == []
