"""Watched folders through the real ingest worker: a real folder on disk, polled again and again
as Celery beat would; files added, changed, deleted and brought back between polls; hostile and
ignored files; an unmounted share; a poll held by another; an administrator adding a source in
the admin console and polling it now (the real worker runs the poll).

Real files: licence texts from ``/usr/share/common-licenses`` and contracts from CUAD-dev
(``../shared/data/cuad-dev`` beside the repository)."""

from __future__ import annotations

import os
import shutil
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Group, User
from django.urls import reverse
from django.utils import timezone

from documents.models import Batch, Chunk, Document, Source, SourceItem
from documents.search import searchable_document_ids
from documents.source_services import source_forget_failed, source_poll, sources_due
from tests.conftest import all_read, read, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
CUAD = ROOT.parent / "shared" / "data" / "cuad-dev" / "pdf"
LICENCES = Path("/usr/share/common-licenses")
HOUR_AGO = time.time() - 3600


@pytest.fixture
def legal(alice) -> Group:
    group = Group.objects.create(name="Legal")
    alice.groups.add(group)
    return group


@pytest.fixture
def share(tmp_path) -> Path:
    folder = tmp_path / "share"
    folder.mkdir()
    return folder


@pytest.fixture
def source(alice, legal, share, settings) -> Source:
    settings.APPLIANCE_SOURCE_SETTLE_S = 0  # the test writes each file whole before it polls
    source = Source.objects.create(name="Contracts share", kind=Source.Kind.FOLDER, owner=alice,
                                   folder_path=str(share))  # fmt: skip
    source.groups.set([legal])
    return source


def put(folder: Path, relative: str, data: bytes, *, mtime: float = HOUR_AGO) -> Path:
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))
    return path


def poll(source: Source) -> Source:
    polled = source_poll(source_id=source.pk)
    assert polled is not None
    return polled


def of_source(source: Source):
    return Document.objects.filter(source=source, parent__isnull=True)


def test_a_folder_s_new_changed_and_deleted_files_across_polls(alice, legal, share, source, browser, workers):
    licence = LICENCES / "Apache-2.0"
    put(share, "Apache-2.0.txt", licence.read_bytes())
    put(share, "contracts/2019/dev-23.pdf", (CUAD / "dev-23.pdf").read_bytes())
    put(share, "contracts/broken.pdf", b"MZ\x90\x00 a program, named as a PDF")
    put(share, "photo.png", b"\x89PNG\r\n\x1a\n")  # not a document: ignored
    put(share, "contracts/~$dev-23.docx", b"an editor's lock file")  # ignored
    put(share, ".trash/old.pdf", (CUAD / "dev-28.pdf").read_bytes())  # hidden: ignored

    source = poll(source)
    assert source.last_error == "" and source.last_result == "3 new", source.last_result
    assert source.last_success_at is not None and source.poll_started_at is None
    documents = {d.source_path: d for d in of_source(source)}
    assert set(documents) == {"Apache-2.0.txt", "contracts/2019/dev-23.pdf", "contracts/broken.pdf"}
    for document in documents.values():
        assert document.owner == alice and list(document.shared_with.all()) == [legal]
        read(document)
    apache, contract, broken = (documents[k] for k in ("Apache-2.0.txt", "contracts/2019/dev-23.pdf",
                                                       "contracts/broken.pdf"))  # fmt: skip
    assert apache.state == contract.state == Document.State.READY
    assert Chunk.objects.filter(document=contract).exists()
    assert broken.state == Document.State.FAILED and "internal error" not in broken.failure_reason
    # The poll's documents are a batch of the owner's, followed like an upload's.
    batch = Batch.objects.get(owner=alice)
    assert batch.name == "Contracts share (source)" and batch.files_total == 3
    assert set(batch.documents.values_list("pk", flat=True)) == {d.pk for d in documents.values()}

    # Nothing changed: nothing is read again.
    source = poll(source)
    assert source.last_result == "nothing new" and of_source(source).count() == 3
    assert Batch.objects.filter(owner=alice).count() == 1

    # Touched with the same bytes: not a new version.
    os.utime(share / "Apache-2.0.txt", (HOUR_AGO + 60, HOUR_AGO + 60))
    source = poll(source)
    assert of_source(source).count() == 3

    # Changed, and deleted.
    put(share, "Apache-2.0.txt", licence.read_bytes() + b"\nLocal amendment: clause 9 applies to Example Ltd.\n",
        mtime=HOUR_AGO + 120)  # fmt: skip
    (share / "contracts" / "2019" / "dev-23.pdf").unlink()
    source = poll(source)
    assert source.last_result == "1 changed, 1 removed", source.last_result
    newer = of_source(source).get(source_path="Apache-2.0.txt", replaced_by__isnull=True)
    assert newer.pk != apache.pk and newer.owner == alice and list(newer.shared_with.all()) == [legal]
    apache.refresh_from_db()
    contract.refresh_from_db()
    assert apache.replaced_by == newer and apache.state == Document.State.READY  # kept, for what cites it
    assert contract.source_removed_at is not None and contract.state == Document.State.READY  # marked, not deleted
    read(newer)
    assert newer.state == Document.State.READY
    searchable = searchable_document_ids(alice)
    assert newer.pk in searchable and apache.pk not in searchable and contract.pk in searchable
    library = browser.get(reverse("documents:library")).content.decode()
    assert library.count("Apache-2.0.txt") == 1 and "Removed from its source" in library
    page = browser.get(reverse("documents:detail", args=[contract.pk])).content.decode()
    assert "Removed from its source on" in page and "contracts/2019/dev-23.pdf" in page
    page = browser.get(reverse("documents:detail", args=[apache.pk])).content.decode()
    assert "this is an earlier version" in page and reverse("documents:detail", args=[newer.pk]) in page

    # The deleted file comes back: present again, no new document.
    put(share, "contracts/2019/dev-23.pdf", (CUAD / "dev-23.pdf").read_bytes(), mtime=HOUR_AGO + 180)
    source = poll(source)
    contract.refresh_from_db()
    assert contract.source_removed_at is None and of_source(source).count() == 4  # three files, one earlier version

    # A share that is not mounted (an empty folder where files were): nothing is marked removed.
    hidden = share.parent / "elsewhere"
    shutil.move(share, hidden)
    share.mkdir()
    source = poll(source)
    assert "is the share mounted?" in source.last_error and "Nothing was marked removed" in source.last_error
    assert not Document.objects.filter(source=source, source_removed_at__isnull=False).exists()
    share.rmdir()
    source = poll(source)
    assert "does not exist" in source.last_error
    shutil.move(hidden, share)
    source = poll(source)
    assert source.last_error == "" and source.last_result == "nothing new"
    all_read()


def test_a_file_over_the_size_limit_fails_alone_and_is_tried_again_when_it_changes_or_when_asked(
    queued, share, source, settings
):
    settings.APPLIANCE_MAX_UPLOAD_MB = 1
    put(share, "big.txt", b"a" * (1024 * 1024 + 1))
    put(share, "small.txt", b"A short letter about the lease of the third floor.")
    source = poll(source)
    assert source.last_error == "" and source.last_result == "1 new, 1 failed"
    item = SourceItem.objects.get(source=source, key="big.txt")
    assert item.state == SourceItem.State.FAILED and "at most 1 MB" in item.error
    assert source_poll(source_id=source.pk).last_result == "nothing new"  # not read again unchanged
    settings.APPLIANCE_MAX_UPLOAD_MB = 2  # raised: the administrator has the failed files tried again
    assert source_forget_failed(source=source) == 1
    assert source_poll(source_id=source.pk).last_result == "1 new"
    assert of_source(source).filter(source_path="big.txt").exists()
    put(share, "huge.txt", b"a" * (2 * 1024 * 1024 + 1))
    assert source_poll(source_id=source.pk).last_result == "1 failed"
    put(share, "huge.txt", b"a shorter file now", mtime=HOUR_AGO + 60)  # changed: tried again by itself
    assert source_poll(source_id=source.pk).last_result == "1 new"


def test_a_poll_never_runs_twice_at_once_and_a_dead_poll_s_hold_expires(queued, share, source):
    put(share, "a.txt", b"The first file of the share.")
    now = timezone.now()
    Source.objects.filter(pk=source.pk).update(poll_started_at=now)  # another worker is polling it
    assert source_poll(source_id=source.pk) is None
    assert not of_source(source).exists() and source.pk not in sources_due()
    Source.objects.filter(pk=source.pk).update(poll_started_at=now - timedelta(hours=1))  # that worker died
    assert source.pk in sources_due()
    polled = source_poll(source_id=source.pk)
    assert polled is not None and polled.last_result == "1 new" and polled.poll_started_at is None
    assert source.pk not in sources_due()  # polled a moment ago; due again after its interval
    Source.objects.filter(pk=source.pk).update(last_polled_at=now - timedelta(seconds=source.poll_interval_s + 1))
    assert source.pk in sources_due()
    Source.objects.filter(pk=source.pk).update(enabled=False)
    assert source.pk not in sources_due() and source_poll(source_id=source.pk) is None


def test_an_administrator_adds_a_folder_in_the_admin_console_and_polls_it_now(alice, legal, share, workers):
    admin = User.objects.create_superuser(username="root", password="an administrator's password")
    from django.test import Client

    client = Client()
    client.force_login(admin)
    put(share, "BSD.txt", (LICENCES / "BSD").read_bytes(), mtime=time.time() - 3600)
    form = {
        "name": "Scans",
        "kind": "folder",
        "enabled": "on",
        "owner": alice.pk,
        "groups": [legal.pk],
        "poll_interval_s": "300",
        "folder_path": "relative/path",
        "include_patterns": "",
        "imap_tls": "implicit",
        "imap_mailbox": "INBOX",
        "items-TOTAL_FORMS": "0",
        "items-INITIAL_FORMS": "0",
    }
    refused = client.post(reverse("admin:documents_source_add"), form)
    assert refused.status_code == 200 and "Give the folder&#x27;s absolute path" in refused.content.decode()
    form["folder_path"] = str(share)
    added = client.post(reverse("admin:documents_source_add"), form)
    assert added.status_code == 302, added.content.decode()[:3000]
    source = Source.objects.get(name="Scans")
    assert list(source.groups.all()) == [legal] and source.owner == alice
    listing = client.get(reverse("admin:documents_source_changelist")).content.decode()
    assert "Not polled yet" in listing

    client.post(reverse("admin:documents_source_changelist"), {"action": "poll_now", "_selected_action": [source.pk]})
    document = wait_until(
        lambda: Document.objects.filter(source=source).first(), timeout_s=120, message="the worker's poll"
    )
    assert document.source_path == "BSD.txt" and document.owner == alice
    read(document)
    assert document.state == Document.State.READY
    source.refresh_from_db()
    assert source.last_result == "1 new" and source.last_error == ""
    listing = client.get(reverse("admin:documents_source_changelist")).content.decode()
    assert "OK, polled" in listing and f'?source__id__exact={source.pk}">1</a>' in listing
    filtered = client.get(reverse("admin:documents_document_changelist"), {"source__id__exact": source.pk})
    assert filtered.status_code == 200 and "BSD" in filtered.content.decode()
    assert client.get(reverse("admin:documents_source_change", args=[source.pk])).status_code == 200


def test_beat_s_tick_polls_the_sources_due_through_the_worker(alice, legal, share, source, workers):
    from documents.tasks import poll_due_sources

    put(share, "GPL-3.txt", (LICENCES / "GPL-3").read_bytes())
    Source.objects.filter(pk=source.pk).update(last_polled_at=timezone.now())  # not due yet
    poll_due_sources.delay()
    time.sleep(3)
    assert not of_source(source).exists()
    Source.objects.filter(pk=source.pk).update(last_polled_at=timezone.now() - timedelta(seconds=301))
    poll_due_sources.delay()
    document = wait_until(lambda: of_source(source).first(), timeout_s=120, message="the tick's poll")
    assert document.source_path == "GPL-3.txt" and list(document.shared_with.all()) == [legal]
    all_read()


def test_the_appliance_s_own_data_is_no_source(alice, settings):
    secrets = Path(settings.VAR_DIR) / "secrets"
    for number, fields in enumerate((
        {"kind": Source.Kind.FOLDER, "folder_path": str(secrets)},
        {"kind": Source.Kind.FOLDER, "folder_path": "/"},  # would walk into it
        {"kind": Source.Kind.IMAP, "imap_host": "mail.example.org", "imap_username": "x",
         "imap_password_file": str(secrets / "secret_key")},  # its first line sent as a password
    )):  # fmt: skip
        source = Source.objects.create(name=f"Bad source {number}", owner=alice, **fields)  # not by the form
        polled = source_poll(source_id=source.pk)
        assert "settings are refused" in polled.last_error and "the appliance's own data" in polled.last_error
        assert not Document.objects.exists()


def test_a_full_queue_stops_a_poll_and_the_next_goes_on_from_there(queued, alice, share, source, settings):
    settings.APPLIANCE_MAX_INGESTING_PER_USER = 2  # no worker here: what is queued stays waiting
    for name in ("Apache-2.0", "BSD", "GPL-3", "MPL-2.0"):
        put(share, f"{name}.txt", (LICENCES / name).read_bytes())
    source = poll(source)
    assert source.last_error == "" and of_source(source).count() == 2
    assert sorted(queued) == sorted(of_source(source).values_list("pk", flat=True))  # queued for the worker
    assert source.last_result.startswith("2 new; stopped for now, the next poll goes on:")
    assert "still being read" in source.last_result
    assert source.backlog and source.pk in sources_due()  # again at beat's next tick, not in 5 minutes
    settings.APPLIANCE_MAX_INGESTING_PER_USER = 0
    source = poll(source)
    assert source.last_result == "2 new" and of_source(source).count() == 4
    assert not source.backlog and source.pk not in sources_due()


def test_a_poll_takes_at_most_its_limit_and_the_rest_at_the_next_tick(queued, share, source, settings):
    settings.APPLIANCE_SOURCE_MAX_ITEMS_PER_POLL = 2
    for name in ("Apache-2.0", "BSD", "GPL-3"):
        put(share, f"{name}.txt", (LICENCES / name).read_bytes())
    source = poll(source)
    assert source.last_result == "2 new, 1 waiting" and source.backlog and source.pk in sources_due()
    source = poll(source)
    assert source.last_result == "1 new" and not source.backlog and of_source(source).count() == 3


def test_a_file_changed_back_makes_its_earlier_version_current_and_a_copy_keeps_one_current(queued, share, source):
    put(share, "terms.txt", b"Payment is due within 30 days of the invoice.")
    put(share, "copy of terms.txt", b"Payment is due within 30 days of the invoice.")  # the same bytes: one document
    source = poll(source)
    first = of_source(source).get()
    put(share, "terms.txt", b"Payment is due within 60 days of the invoice.", mtime=HOUR_AGO + 60)
    source = poll(source)
    assert source.last_result == "1 changed"
    second = of_source(source).exclude(pk=first.pk).get()
    first.refresh_from_db()
    assert first.replaced_by is None  # "copy of terms.txt" still holds its bytes
    (share / "copy of terms.txt").unlink()
    poll(source)
    put(share, "terms.txt", b"Payment is due within 60 days of the invoice, or 90 for public bodies.",
        mtime=HOUR_AGO + 120)  # fmt: skip
    poll(source)
    third = of_source(source).exclude(pk__in=[first.pk, second.pk]).get()
    second.refresh_from_db()
    assert second.replaced_by == third
    put(share, "terms.txt", b"Payment is due within 60 days of the invoice.", mtime=HOUR_AGO + 180)  # back again
    source = poll(source)
    assert source.last_result == "1 changed" and of_source(source).count() == 3
    second.refresh_from_db()
    third.refresh_from_db()
    assert second.replaced_by is None and third.replaced_by == second


def test_the_api_says_where_a_document_came_from(queued, alice, share, source):
    from django.test import Client

    from api.services import token_create

    put(share, "letters/reply.txt", b"We accept the offer of 3 March.")
    source = poll(source)
    document = of_source(source).get()
    _, secret = token_create(user=alice, name="a records tool", scopes=["read"])
    body = Client().get(f"/api/v1/documents/{document.pk}", HTTP_AUTHORIZATION=f"Bearer {secret}").json()
    assert body["source_id"] == source.pk and body["source_path"] == "letters/reply.txt"
    assert body["source_removed_at"] is None and body["replaced_by_id"] is None


def test_metrics_say_which_source_is_failing_and_when_it_last_succeeded(queued, share, source):
    from django.test import Client
    from prometheus_client.parser import text_string_to_metric_families

    def scrape() -> dict:
        text = Client().get("/metrics").content.decode()
        return {
            (sample.name, sample.labels.get("source")): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name.startswith("appliance_source_")
        }

    put(share, "a.txt", b"A letter about the lease.")
    poll(source)
    samples = scrape()
    assert samples[("appliance_source_failing", "Contracts share")] == 0
    succeeded = samples[("appliance_source_last_success_timestamp_seconds", "Contracts share")]
    assert abs(succeeded - time.time()) < 60
    shutil.rmtree(share)  # the share is gone
    poll(source)
    samples = scrape()
    assert samples[("appliance_source_failing", "Contracts share")] == 1
    assert samples[("appliance_source_last_success_timestamp_seconds", "Contracts share")] == succeeded


def test_files_swapped_after_the_listing_fail_alone_and_a_latin_1_name_is_taken(
    queued, tmp_path, share, source, settings, monkeypatch
):
    """A poll of a large share reads its last files minutes after it listed them, so what the
    listing saw is checked again as each file is opened: a file swapped since for a link out of
    the folder, a FIFO (whose open would wait for a writer for ever) or a file grown past the
    limit fails alone, as does one that breaks something unforeseen; and a name that is not
    UTF-8 (Latin-1 on an old share), which Postgres could not store, no longer stops the poll."""
    from documents import source_services

    settings.APPLIANCE_MAX_UPLOAD_MB = 1
    secret = tmp_path / "secret_key"
    secret.write_bytes(b"the appliance's own secret, outside the share")
    for name in ("a-link-later.txt", "b-pipe-later.txt", "c-grows-later.txt", "d-breaks.txt"):
        put(share, name, f"An ordinary letter called {name}, for now.".encode())
    latin_1 = os.fsdecode(b"r\xe9sum\xe9.txt")
    put(share, latin_1, (LICENCES / "BSD").read_bytes())
    put(share, "plain.txt", (LICENCES / "Apache-2.0").read_bytes())
    list_folder, read_listed = source_services._list_folder, source_services._read_listed

    def list_then_swap(root, *, patterns):
        listed = list_folder(root, patterns=patterns)
        (share / "a-link-later.txt").unlink()
        (share / "a-link-later.txt").symlink_to(secret)
        (share / "b-pipe-later.txt").unlink()
        os.mkfifo(share / "b-pipe-later.txt")
        (share / "c-grows-later.txt").write_bytes(b"a" * (1024 * 1024 + 1))
        return listed

    def read_or_break(root, relative, *, limit):
        if relative == "d-breaks.txt":
            raise RuntimeError("a fake fault: something unforeseen")
        return read_listed(root, relative, limit=limit)

    monkeypatch.setattr(source_services, "_list_folder", list_then_swap)
    monkeypatch.setattr(source_services, "_read_listed", read_or_break)
    source = poll(source)
    assert source.last_error == "" and source.last_result == "2 new, 4 failed", (source.last_error, source.last_result)
    errors = dict(SourceItem.objects.filter(source=source, state=SourceItem.State.FAILED).values_list("key", "error"))
    assert "leads outside the folder" in errors["a-link-later.txt"]
    assert "no longer a regular file" in errors["b-pipe-later.txt"]
    assert "grew past 1 MB since it was listed" in errors["c-grows-later.txt"]
    assert "internal error" in errors["d-breaks.txt"]
    assert not Document.objects.filter(size_bytes=secret.stat().st_size).exists()  # the secret was not taken
    resume = of_source(source).get(source_path="résumé.txt")
    assert resume.filename == "résumé.txt" and resume.title == "résumé"
    assert SourceItem.objects.get(source=source, key="résumé.txt").document == resume
    monkeypatch.setattr(source_services, "_list_folder", list_folder)
    assert "new" not in poll(source).last_result  # the Latin-1 file is known by its key: not taken twice


def test_a_folder_given_by_a_link_is_read_where_the_link_led_when_the_poll_began(
    queued, tmp_path, share, source, monkeypatch
):
    """An administrator may give the share by a link (``/srv/records`` to the mount): it is
    polled as the folder it leads to, resolved once per poll, so a link pointed elsewhere while
    a poll runs cannot have it read another folder's files under the share's names."""
    from documents import source_services

    licence = (LICENCES / "BSD").read_bytes()
    put(share, "terms.txt", licence)
    elsewhere = tmp_path / "elsewhere"
    put(elsewhere, "terms.txt", b"Another folder's terms, which nobody shared with the appliance.")
    link = tmp_path / "records"
    link.symlink_to(share)
    Source.objects.filter(pk=source.pk).update(folder_path=str(link))
    list_folder = source_services._list_folder

    def list_then_repoint(root, *, patterns):
        listed = list_folder(root, patterns=patterns)
        link.unlink()
        link.symlink_to(elsewhere)
        return listed

    monkeypatch.setattr(source_services, "_list_folder", list_then_repoint)
    source = poll(source)
    assert source.last_error == "" and source.last_result == "1 new", (source.last_error, source.last_result)
    assert of_source(source).get().size_bytes == len(licence)  # the share's file, not the other folder's
