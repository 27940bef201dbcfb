"""The periodic LDAP sync against a real slapd: someone removed from a group, locked or deleted in
the directory loses that here without signing in again; their session and API tokens stop
working. And Celery beat really runs it: a beat process and an ingest worker, as ``make run``
starts them, bring an account in line within the interval."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.test import Client

from api import services as token_services
from api.models import ApiToken, Scope
from directory import services
from directory.backends import ldap_policy
from directory.ldap import LdapDirectory
from directory.models import DirectoryIdentity
from directory.tasks import ldap_sync
from tests.directory import slapd as directory
from tests.directory.test_ldap_signin import shared_document, sign_in

pytestmark = pytest.mark.django_db


def signed_in_with_token(username: str) -> tuple[Client, User, str]:
    client = sign_in(username, directory.PASSWORDS[username])
    assert client.signed_in
    user = User.objects.get(username=username)
    _, raw = token_services.token_create(user=user, name="case system", scopes=[Scope.READ])
    return client, user, raw


def api_status(raw: str) -> int:
    return Client().get("/api/v1/documents", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code


def test_removed_from_a_group_loses_its_documents_at_the_sync_without_signing_in(ldap_settings, slapd):
    legal = shared_document("Legal memo", "Legal")
    client, alice, raw = signed_in_with_token("alice")
    assert client.get(f"/documents/{legal.pk}/").status_code == 200
    assert any(
        d["id"] == legal.pk
        for d in Client().get("/api/v1/documents", HTTP_AUTHORIZATION=f"Bearer {raw}").json()["results"]
    )

    slapd.remove_member(directory.LEGAL_DN, directory.person_dn("alice"))
    assert client.get(f"/documents/{legal.pk}/").status_code == 200  # until the sync runs
    ldap_sync()  # the beat task, as the worker runs it

    assert not alice.groups.filter(name="Legal").exists()
    assert client.get(f"/documents/{legal.pk}/").status_code == 404  # the same session
    assert api_status(raw) == 200  # still alice: only the group went
    listed = Client().get("/api/v1/documents", HTTP_AUTHORIZATION=f"Bearer {raw}").json()["results"]
    assert all(d["id"] != legal.pk for d in listed)
    identity = DirectoryIdentity.objects.get(user=alice)
    assert identity.last_synced_at is not None and identity.directory_groups == []


def test_a_locked_or_deleted_account_is_deactivated_and_its_tokens_and_session_stop(ldap_settings, slapd):
    bob_client, bob, bob_token = signed_in_with_token("bob")
    carol_client, carol, carol_token = signed_in_with_token("carol")
    alice_client, alice, alice_token = signed_in_with_token("alice")
    assert {api_status(bob_token), api_status(carol_token), api_status(alice_token)} == {200}

    slapd.lock(directory.person_dn("bob"))  # disabled (ppolicy), left out by the user filter
    slapd.delete(directory.person_dn("carol"))
    report = services.ldap_sync(directory=LdapDirectory.from_settings(), policy=ldap_policy())

    assert sorted(report.deactivated) == ["bob", "carol"]
    for user, client, token in ((bob, bob_client, bob_token), (carol, carol_client, carol_token)):
        user.refresh_from_db()
        assert not user.is_active
        assert api_status(token) == 401
        assert ApiToken.objects.get(user=user).revoked_at is not None  # revoked, not only refused
        assert client.get("/documents/")["Location"].startswith("/accounts/login/")  # signed out
        assert DirectoryIdentity.objects.get(user=user).gone_at is not None
    # alice is untouched.
    alice.refresh_from_db()
    assert alice.is_active and api_status(alice_token) == 200
    assert alice_client.get("/documents/").status_code == 200
    # A locked account cannot sign in again either; a second sync changes nothing more.
    assert not sign_in("bob", directory.PASSWORDS["bob"]).signed_in
    assert services.ldap_sync(directory=LdapDirectory.from_settings(), policy=ldap_policy()).deactivated == []


def test_an_account_unlocked_in_the_directory_signs_in_again(ldap_settings, slapd):
    import ldap3

    signed_in_with_token("bob")
    slapd.lock(directory.person_dn("bob"))
    ldap_sync()
    assert not User.objects.get(username="bob").is_active
    slapd.modify(directory.person_dn("bob"), {"pwdAccountLockedTime": [(ldap3.MODIFY_DELETE, [])]})
    assert sign_in("bob", directory.PASSWORDS["bob"]).signed_in
    bob = User.objects.get(username="bob")
    assert bob.is_active and DirectoryIdentity.objects.get(user=bob).gone_at is None


def test_a_directory_answering_with_nobody_changes_nothing(ldap_settings):
    signed_in_with_token("alice")
    ldap_settings.APPLIANCE_LDAP_USER_SEARCH_BASE = f"ou=groups,{directory.SUFFIX}"  # a wrong base: no people
    with pytest.raises(services.SyncRefused):
        ldap_sync()
    assert User.objects.get(username="alice").is_active


def test_an_administrator_deactivated_account_stays_deactivated(ldap_settings):
    signed_in_with_token("alice")
    User.objects.filter(username="alice").update(is_active=False)
    assert not sign_in("alice", directory.PASSWORDS["alice"]).signed_in
    assert not User.objects.get(username="alice").is_active


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_celery_beat_runs_the_sync_within_its_interval(ldap_settings, slapd, tmp_path):
    from tests.conftest import _child_env, _stop, _test_database_url, wait_until

    legal = shared_document("Legal memo", "Legal")
    client, alice, _ = signed_in_with_token("alice")
    assert client.get(f"/documents/{legal.pk}/").status_code == 200

    # The settings `make run` would have with these variables: a schedule, so a beat process.
    ldap_settings.CELERY_BEAT_SCHEDULE = {"ldap-sync": {"task": "directory.tasks.ldap_sync", "schedule": 3.0}}
    # A broker database of their own: a worker of the suite's (without these settings) must not
    # take the sync's tasks.
    broker = django_settings.REDIS_URL.rsplit("/", 1)[0] + "/7"
    env = _child_env(
        DATABASE_URL=_test_database_url(),
        REDIS_URL=broker,
        APPLIANCE_LDAP_URL=slapd.url,
        APPLIANCE_LDAP_BIND_DN=directory.SERVICE_DN,
        APPLIANCE_LDAP_USER_SEARCH_BASE=f"ou=people,{directory.SUFFIX}",
        APPLIANCE_LDAP_USER_FILTER=directory.USER_FILTER,
        APPLIANCE_LDAP_GROUP_SEARCH_BASE=f"ou=groups,{directory.SUFFIX}",
        APPLIANCE_LDAP_GROUP_MAP=f'{{"{directory.LEGAL_DN}": "Legal", "{directory.FINANCE_DN}": "Finance"}}',
        APPLIANCE_LDAP_SYNC_INTERVAL_S="5",
    )
    password_file = tmp_path / "bind-password"
    password_file.write_text(directory.SERVICE_PASSWORD + "\n")
    env["APPLIANCE_LDAP_BIND_PASSWORD_FILE"] = str(password_file)
    env.pop("APPLIANCE_LDAP_BIND_PASSWORD", None)
    (Path(django_settings.VAR_DIR) / "celerybeat-schedule").unlink(missing_ok=True)
    from appliance.processes import start_appliance_processes

    processes = start_appliance_processes(
        {"beat", "ingest-worker"},
        settings=ldap_settings,
        env=env,
        log_dir=Path(django_settings.VAR_DIR) / "logs",
        tag="sync-test",
        fresh_log=True,
        tie_to_parent=True,
    )
    try:
        assert len(processes) == 2
        slapd.remove_member(directory.LEGAL_DN, directory.person_dn("alice"))
        started = time.monotonic()
        wait_until(
            lambda: not alice.groups.filter(name="Legal").exists(),
            timeout_s=60,
            message="the beat-scheduled sync to take Legal from alice",
        )
        assert time.monotonic() - started < 60
        assert client.get(f"/documents/{legal.pk}/").status_code == 404
    finally:
        for process in processes:
            _stop(process)


def test_the_beat_process_is_declared_with_the_web_role_only_when_ldap_is_configured(settings):
    import sys

    from appliance.supervisor import appliance_processes

    settings.CELERY_BEAT_SCHEDULE = {}
    assert "beat" not in {spec.name for spec in appliance_processes(python=sys.executable, port=1, settings=settings)}
    settings.CELERY_BEAT_SCHEDULE = {"ldap-sync": {"task": "directory.tasks.ldap_sync", "schedule": 900.0}}
    web_node = appliance_processes(python=sys.executable, port=1, settings=settings, roles=("web",))
    assert [spec.name for spec in web_node] == ["web", "beat"]
    workers_only = appliance_processes(python=sys.executable, port=1, settings=settings, roles=("ingest", "decode"))
    assert "beat" not in {spec.name for spec in workers_only}


def test_the_settings_schedule_the_sync_when_ldap_is_configured(tmp_path):
    """The settings module as `make run` reads it, in a process of its own."""
    import json
    import os
    import subprocess
    import sys

    code = "from django.conf import settings as s; import json; print(json.dumps([s.CELERY_BEAT_SCHEDULE, s.AUTHENTICATION_BACKENDS]))"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "appliance.settings_test"}
    for name in [n for n in env if n.startswith(("APPLIANCE_LDAP_", "APPLIANCE_SOURCE_TICK_S"))]:
        del env[name]
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    schedule, backends = json.loads(off.stdout.strip().splitlines()[-1])
    assert set(schedule) == {"sources-poll"}  # sources are polled whether a directory is configured or not
    assert backends == ["django.contrib.auth.backends.ModelBackend"]
    env.update(
        APPLIANCE_LDAP_URL="ldaps://dc1.example.org,ldaps://dc2.example.org",
        APPLIANCE_LDAP_USER_SEARCH_BASE="ou=people,dc=example,dc=org",
        APPLIANCE_LDAP_SYNC_INTERVAL_S="600",
    )
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    schedule, backends = json.loads(on.stdout.strip().splitlines()[-1])
    assert schedule["ldap-sync"]["task"] == "directory.tasks.ldap_sync" and schedule["ldap-sync"]["schedule"] == 600.0
    assert backends == ["django.contrib.auth.backends.ModelBackend", "directory.backends.LdapBackend"]
    env.update(APPLIANCE_OIDC_DISCOVERY_URL="https://sso.example.org/realms/x", APPLIANCE_OIDC_CLIENT_ID="appliance")
    both = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    schedule, backends = json.loads(both.stdout.strip().splitlines()[-1])
    assert schedule["oidc-sync"]["task"] == "directory.tasks.oidc_sync" and schedule["oidc-sync"]["schedule"] == 900.0
    assert backends[-1] == "directory.oidc.OidcBackend"
    env["APPLIANCE_LDAP_GROUP_MAP"] = "{not json"
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and "APPLIANCE_LDAP_GROUP_MAP is not JSON" in bad.stderr
