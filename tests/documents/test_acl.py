"""Ownership and sharing: user B reaches none of user A's private documents by any path; a
member of a group A shared with reads them; only the owner changes or deletes them."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import URLPattern, reverse

from documents import services
from documents import urls as document_urls
from documents.models import Batch, Document
from documents.search import search_passages
from inference.models import Job
from tests.factories import ready_document

pytestmark = pytest.mark.django_db

SECRET = "The merger with Fabrikam closes on 14 February; codename BLUE-HERON-77."


@pytest.fixture
def people():
    User = get_user_model()
    alice = User.objects.create_user("alice", password="pw-alice-long-enough")
    bob = User.objects.create_user("bob", password="pw-bob-long-enough")
    carol = User.objects.create_user("carol", password="pw-carol-long-enough")
    legal = Group.objects.create(name="Legal")
    alice.groups.add(legal)
    carol.groups.add(legal)
    return alice, bob, carol, legal


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _document_routes():
    """Every URL of the documents app that takes a document id, with the method it answers."""
    for pattern in document_urls.urlpatterns:
        if isinstance(pattern, URLPattern) and "document_id" in str(pattern.pattern):
            method = "post" if pattern.name in {"share", "delete", "cancel"} else "get"
            yield pattern.name, method


def test_a_stranger_reaches_nothing_of_a_private_document(people):
    alice, bob, _, _ = people
    private = ready_document(alice, "merger-memo", SECRET)
    client = _client(bob)

    routes = list(_document_routes())
    assert {"detail", "status", "download", "share", "delete", "cancel"} <= {name for name, _ in routes}
    for name, method in routes:
        response = getattr(client, method)(reverse(f"documents:{name}", args=[private.pk]))
        assert response.status_code == 404, name  # 404, not 403: B cannot learn it exists
    assert client.post(reverse("inference:summarise", args=[private.pk])).status_code == 404
    assert not Job.objects.exists()

    library = client.get(reverse("documents:library"))
    assert b"merger-memo" not in library.content
    for query in ("BLUE-HERON-77", "merger with Fabrikam", "When does the merger close?"):
        assert search_passages(user=bob, query=query) == []
        page = client.get(reverse("documents:search"), {"q": query}).content
        assert b"merger-memo" not in page and b"Fabrikam closes" not in page
    assert Document.objects.filter(pk=private.pk).exists()  # the POSTs changed nothing


def test_a_stranger_reaches_nothing_of_a_batch_and_a_group_member_cannot_cancel_its_files(people):
    alice, bob, carol, legal = people
    memo = ready_document(alice, "merger-memo", SECRET)
    batch = Batch.objects.create(owner=alice, name="merger-memos.zip", files_total=1)
    Document.objects.filter(pk=memo.pk).update(batch=batch, state=Document.State.EMBEDDING)
    memo.shared_with.set([legal])
    routes = [p for p in document_urls.urlpatterns if isinstance(p, URLPattern) and "batch_id" in str(p.pattern)]
    assert {p.name for p in routes} == {"batch", "batch_progress", "batch_cancel"}
    for user in (bob, carol):  # a stranger, and a member of the group the batch's file is shared with
        client = _client(user)
        for pattern in routes:
            method = "post" if pattern.name == "batch_cancel" else "get"
            response = getattr(client, method)(reverse(f"documents:{pattern.name}", args=[batch.pk]))
            assert response.status_code == 404, (user, pattern.name)
        assert b"merger-memos" not in client.get(reverse("documents:batches")).content
    # Carol reads the shared file, but only its owner may cancel its reading.
    client = _client(carol)
    assert client.get(reverse("documents:detail", args=[memo.pk])).status_code == 200
    client.post(reverse("documents:cancel", args=[memo.pk]))
    memo.refresh_from_db()
    batch.refresh_from_db()
    assert memo.state == Document.State.EMBEDDING and not memo.cancel_requested
    assert batch.state == Batch.State.RUNNING


def test_sharing_with_a_group_lets_its_members_read(people):
    alice, bob, carol, legal = people
    memo = ready_document(alice, "merger-memo", SECRET)
    assert search_passages(user=carol, query="BLUE-HERON-77") == []

    services.document_share(document=memo, user=alice, groups=[legal])
    passages = search_passages(user=carol, query="BLUE-HERON-77")
    assert [p.document_id for p in passages] == [memo.pk]
    assert passages[0].page_start == 1
    carol_client = _client(carol)
    assert carol_client.get(reverse("documents:detail", args=[memo.pk])).status_code == 200
    download = carol_client.get(reverse("documents:download", args=[memo.pk]))
    assert b"".join(download.streaming_content) == SECRET.encode()
    assert search_passages(user=bob, query="BLUE-HERON-77") == []  # not in the group

    # A reader is not an owner: no re-sharing, no deleting.
    with pytest.raises(services.NotAllowed):
        services.document_share(document=memo, user=carol, groups=[])
    response = carol_client.post(reverse("documents:delete", args=[memo.pk]))
    assert Document.objects.filter(pk=memo.pk).exists() and response.status_code == 302

    services.document_share(document=memo, user=alice, groups=[])
    assert search_passages(user=carol, query="BLUE-HERON-77") == []
    assert carol_client.get(reverse("documents:detail", args=[memo.pk])).status_code == 404


def test_an_owner_cannot_share_with_a_group_they_are_not_in(people):
    alice, bob, _, legal = people
    notes = ready_document(bob, "bob-notes", "Bob's notes on the quarterly figures.")
    with pytest.raises(services.NotAllowed):
        services.document_share(document=notes, user=bob, groups=[legal])
    assert not notes.shared_with.exists()


@pytest.mark.django_db(transaction=True)
def test_an_attachment_made_while_its_e_mail_is_made_private_is_private_too(people, queued):
    """The worker makes an e-mail's attachments, each shared like the e-mail, in a transaction
    under the upload's row lock; sharing takes that lock first. Without it, an attachment made
    (not yet committed) while its owner made the e-mail private was not in the tree the share
    changed, and kept the group."""
    import threading
    import time

    from django.db import connection, transaction

    from documents.extraction.base import Attachment

    alice, _, carol, legal = people
    mail = Document.objects.create(owner=alice, title="mail", filename="mail.eml", size_bytes=1, sha256="m" * 64)
    mail.shared_with.set([legal])
    made, commit = threading.Event(), threading.Event()

    def worker():  # what the ingest worker's _store_pages does with an e-mail's attachments
        try:
            with transaction.atomic():
                assert services._attachments_allowed(mail, 1) == (1, "")
                services._create_child(mail, Attachment("minutes.txt", SECRET.encode(), "text/plain"))
                made.set()
                commit.wait(30)
        finally:
            connection.close()

    def make_private():
        try:
            services.document_share(document=mail, user=alice, groups=[])
        finally:
            connection.close()

    reading = threading.Thread(target=worker)
    reading.start()
    assert made.wait(30)
    sharing = threading.Thread(target=make_private)
    sharing.start()
    time.sleep(0.5)
    waited = sharing.is_alive()  # held by the upload's lock until the attachments are committed
    commit.set()
    reading.join(30)
    sharing.join(30)
    assert waited
    attachment = Document.objects.get(parent=mail)
    assert list(attachment.shared_with.all()) == [] and list(mail.shared_with.all()) == []
    from inference.grounding import readable_ids

    assert readable_ids(carol, [mail.pk, attachment.pk]) == set()
