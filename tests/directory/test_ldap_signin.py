"""LDAP sign-in against a real slapd (tests/directory/slapd.py), through the appliance's own
sign-in page: search then bind, accounts linked by entryUUID, groups and flags from the
directory's groups, a locked account refused, local accounts still signing in, TLS verified."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from api import services as token_services
from api.models import Scope
from directory.models import DirectoryIdentity, Provider
from documents.models import Document
from documents.selectors import documents_readable_by
from tests.directory import slapd as directory

pytestmark = pytest.mark.django_db


def sign_in(username: str, password: str) -> Client:
    client = Client()
    response = client.post("/accounts/login/", {"username": username, "password": password})
    client.signed_in = response.status_code == 302 and "_auth_user_id" in client.session  # type: ignore[attr-defined]
    return client


def entry_uuid(slapd, uid: str) -> str:
    connection = slapd.admin()
    try:
        connection.search(directory.person_dn(uid), "(objectClass=*)", search_scope="BASE", attributes=["entryUUID"])
        return str(connection.entries[0].entryUUID.value)
    finally:
        connection.unbind()


def shared_document(title: str, group_name: str) -> Document:
    owner, _ = User.objects.get_or_create(username="owner-of-shared")
    document = Document.objects.create(
        owner=owner, title=title, filename=f"{title}.txt", kind=Document.Kind.TEXT, size_bytes=1,
        sha256=title.ljust(64, "0")[:64], state=Document.State.READY,
    )  # fmt: skip
    group, _ = Group.objects.get_or_create(name=group_name)
    document.shared_with.add(group)
    return document


def test_a_directory_account_signs_in_and_is_linked_by_its_entry_uuid(ldap_settings, slapd):
    client = sign_in("alice", directory.PASSWORDS["alice"])
    assert client.signed_in
    alice = User.objects.get(username="alice")
    assert (alice.email, alice.first_name, alice.last_name) == ("alice@example.org", "Alice", "Archer")
    assert not alice.has_usable_password()  # the directory's password is not kept here
    identity = DirectoryIdentity.objects.get(user=alice)
    assert identity.provider == Provider.LDAP
    assert identity.subject == entry_uuid(slapd, "alice")
    assert identity.distinguished_name == directory.person_dn("alice")
    # The sign-in page's session is alice's: the library answers.
    assert client.get("/documents/").status_code == 200


def test_a_wrong_password_an_unknown_name_and_a_locked_account_are_refused(ldap_settings):
    assert not sign_in("alice", "not alice's password").signed_in
    assert not sign_in("nobody-here", "whatever it is").signed_in
    # dave is locked in the directory (pwdAccountLockedTime): the user filter leaves him out.
    assert not sign_in("dave", directory.PASSWORDS["dave"]).signed_in
    assert not User.objects.exists()
    # A filter that is a search string, not a user name, finds nobody (the name is escaped).
    assert not sign_in("*", directory.PASSWORDS["alice"]).signed_in


def test_groups_staff_and_superuser_come_from_the_directory_groups(ldap_settings):
    assert sign_in("alice", directory.PASSWORDS["alice"]).signed_in
    assert sign_in("carol", directory.PASSWORDS["carol"]).signed_in
    alice, carol = User.objects.get(username="alice"), User.objects.get(username="carol")
    assert set(alice.groups.values_list("name", flat=True)) == {"Legal"}
    assert set(carol.groups.values_list("name", flat=True)) == {"Finance"}
    assert not alice.is_staff and not alice.is_superuser
    assert carol.is_staff and carol.is_superuser
    legal = shared_document("Legal memo", "Legal")
    assert list(documents_readable_by(alice)) == [legal]
    assert list(documents_readable_by(carol)) == []


def test_leaving_a_group_in_the_directory_leaves_it_at_the_next_sign_in(ldap_settings, slapd):
    legal = shared_document("Legal memo", "Legal")
    assert sign_in("bob", directory.PASSWORDS["bob"]).signed_in
    bob = User.objects.get(username="bob")
    auditors = Group.objects.create(name="Auditors")  # set here by an administrator, not mapped
    bob.groups.add(auditors)
    assert legal in documents_readable_by(bob)

    slapd.remove_member(directory.LEGAL_DN, directory.person_dn("bob"))
    client = sign_in("bob", directory.PASSWORDS["bob"])
    assert client.signed_in
    assert set(bob.groups.values_list("name", flat=True)) == {"Auditors"}  # Legal gone, Auditors kept
    assert legal not in documents_readable_by(bob)
    assert client.get(f"/documents/{legal.pk}/").status_code == 404

    slapd.add_member(directory.FINANCE_DN, directory.person_dn("bob"))
    assert sign_in("bob", directory.PASSWORDS["bob"]).signed_in
    assert set(bob.groups.values_list("name", flat=True)) == {"Auditors", "Finance"}
    # Losing the admins group takes staff and superuser away.
    slapd.remove_member(directory.ADMINS_DN, directory.person_dn("carol"))
    assert sign_in("carol", directory.PASSWORDS["carol"]).signed_in
    carol = User.objects.get(username="carol")
    assert not carol.is_staff and not carol.is_superuser


def test_a_reused_user_name_gets_a_new_account_not_the_old_ones(ldap_settings, slapd):
    assert sign_in("alice", directory.PASSWORDS["alice"]).signed_in
    first = User.objects.get(username="alice")
    # alice leaves; a new person is given the name alice in the directory (a new entry).
    slapd.delete(directory.person_dn("alice"))
    connection = slapd.admin()
    try:
        connection.add(
            directory.person_dn("alice"),
            ["inetOrgPerson"],
            {"uid": "alice", "cn": "Alice Other", "sn": "Other", "userPassword": "the new alice's password"},
        )
    finally:
        connection.unbind()
    assert sign_in("alice", "the new alice's password").signed_in
    second = DirectoryIdentity.objects.get(subject=entry_uuid(slapd, "alice")).user
    assert second.pk != first.pk
    assert second.username == "alice-2"  # the name is taken here by the first alice's account


def test_a_local_account_of_the_same_name_is_not_taken_over(ldap_settings):
    local = User.objects.create_user("alice", password="the local alice's long password")
    assert sign_in("alice", directory.PASSWORDS["alice"]).signed_in
    linked = DirectoryIdentity.objects.get().user
    assert linked.pk != local.pk and linked.username == "alice-2"
    # The local account still signs in with its own password (Django's backend, first).
    client = sign_in("alice", "the local alice's long password")
    assert client.signed_in and client.session["_auth_user_id"] == str(local.pk)


def test_a_local_break_glass_admin_signs_in_while_the_directory_is_down(ldap_settings, slapd):
    User.objects.create_superuser("admin", password="break glass password here")
    slapd.stop()
    assert not sign_in("alice", directory.PASSWORDS["alice"]).signed_in
    assert sign_in("admin", "break glass password here").signed_in


def test_an_api_token_of_a_directory_account_works(ldap_settings):
    assert sign_in("alice", directory.PASSWORDS["alice"]).signed_in
    alice = User.objects.get(username="alice")
    _, raw = token_services.token_create(user=alice, name="mail plug-in", scopes=[Scope.READ])
    response = Client().get("/api/v1/documents", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 200


def test_starttls_and_ldaps_verify_the_server_against_the_ca_file(ldap_settings, slapd):
    ldap_settings.APPLIANCE_LDAP_START_TLS = True
    ldap_settings.APPLIANCE_LDAP_CA_FILE = slapd.ca_file
    assert sign_in("alice", directory.PASSWORDS["alice"]).signed_in

    ldap_settings.APPLIANCE_LDAP_START_TLS = False
    ldap_settings.APPLIANCE_LDAP_URLS = [slapd.ldaps_url]
    assert sign_in("bob", directory.PASSWORDS["bob"]).signed_in

    # Without the directory's CA the certificate is not trusted: no sign-in, over either.
    ldap_settings.APPLIANCE_LDAP_CA_FILE = None
    assert not sign_in("carol", directory.PASSWORDS["carol"]).signed_in
    ldap_settings.APPLIANCE_LDAP_URLS = [slapd.url]
    ldap_settings.APPLIANCE_LDAP_START_TLS = True
    assert not sign_in("carol", directory.PASSWORDS["carol"]).signed_in
    assert not User.objects.filter(username="carol").exists()


def test_slapd_runs_unprivileged_and_a_rename_in_the_directory_follows(ldap_settings, slapd):
    import os

    import psutil

    if os.geteuid() == 0:
        assert psutil.Process(slapd.process.pid).username() == "nobody"
    assert sign_in("alice", directory.PASSWORDS["alice"]).signed_in
    first = User.objects.get(username="alice")
    connection = slapd.admin()
    try:
        connection.modify_dn(directory.person_dn("alice"), "uid=alice.archer")
    finally:
        connection.unbind()
    assert sign_in("alice.archer", directory.PASSWORDS["alice"]).signed_in
    first.refresh_from_db()
    assert first.username == "alice.archer"  # the same account (same entryUUID), renamed
    assert DirectoryIdentity.objects.get(user=first).distinguished_name == directory.person_dn("alice.archer")
    assert User.objects.count() == 1


def test_an_active_directory_object_guid_is_written_as_ad_writes_it():
    from directory.ldap import stable_id

    # objectGUID {d9b2d8f0-7c5b-4f7a-9a1c-0e3e2f4a5b6c} as AD stores it (the first three parts little-endian).
    raw = bytes.fromhex("f0d8b2d95b7c7a4f9a1c0e3e2f4a5b6c")
    assert stable_id(raw, "objectGUID") == "d9b2d8f0-7c5b-4f7a-9a1c-0e3e2f4a5b6c"
    # Sixteen bytes that happen to be printable are still a GUID.
    assert stable_id(b"ABCDEFGHIJKLMNOP", "objectGUID") == str(__import__("uuid").UUID(bytes_le=b"ABCDEFGHIJKLMNOP"))
    assert stable_id(b"81d656fa-8332-1041-8d32-6554819a0291") == "81d656fa-8332-1041-8d32-6554819a0291"


def test_the_admin_shows_a_users_directory_identity_and_filters_by_it(ldap_settings, slapd):
    assert sign_in("alice", directory.PASSWORDS["alice"]).signed_in
    User.objects.create_user("local-lee", password="a long local password")
    admin_client = Client()
    admin_client.force_login(User.objects.create_superuser("root", password="break glass password here"))
    alice = User.objects.get(username="alice")
    page = admin_client.get(f"/admin/auth/user/{alice.pk}/change/").content.decode()
    assert entry_uuid(slapd, "alice") in page and directory.person_dn("alice") in page
    listed = admin_client.get("/admin/auth/user/?directory=ldap").content.decode()
    assert ">alice<" in listed and "local-lee" not in listed
    local = admin_client.get("/admin/auth/user/?directory=local").content.decode()
    assert "local-lee" in local and ">alice<" not in local
