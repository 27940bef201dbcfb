"""Writes of directory sign-in: an account signed in from the directory, the LDAP sync, and the
deactivation of an account the directory no longer knows.

At every sign-in, and at every sync for LDAP, a directory account's managed groups, staff and
superuser flags are set from its directory groups (``directory.mapping``). An account the
directory no longer lets in (deleted, disabled, outside the user filter) is deactivated here and
its API tokens are revoked: its sessions end at their next request (Django refuses an inactive
user's session) and its tokens at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.contrib.auth.models import Group, User
from django.db import transaction
from django.utils import timezone

from directory.mapping import Grants, GroupPolicy, grants_for
from directory.models import DirectoryIdentity, Provider

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DirectoryAccount:
    """An account as the directory describes it at sign-in."""

    provider: str
    subject: str
    username: str
    groups: tuple[str, ...]
    issuer: str = ""
    email: str = ""
    first_name: str = ""
    last_name: str = ""
    distinguished_name: str = ""


def _free_username(wanted: str) -> str:
    """``wanted``, or ``wanted-2``, ``wanted-3``... if a local account or another identity has it:
    a name is never how an account is found, so a reused name gets an account of its own."""
    base = (wanted or "user")[:140]
    name, n = base, 1
    while User.objects.filter(username__iexact=name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


def _apply_grants(user: User, grants: Grants) -> None:
    current = set(user.groups.filter(name__in=grants.managed_groups).values_list("name", flat=True))
    for name in sorted(grants.groups - current):
        group, _ = Group.objects.get_or_create(name=name)
        user.groups.add(group)
    leaving = current - grants.groups
    if leaving:
        user.groups.remove(*Group.objects.filter(name__in=leaving))
        logger.info("directory: %s left %s", user.username, ", ".join(sorted(leaving)))
    changed = []
    if grants.is_staff is not None and user.is_staff != grants.is_staff:
        user.is_staff = grants.is_staff
        changed.append("is_staff")
    if grants.is_superuser is not None and user.is_superuser != grants.is_superuser:
        user.is_superuser = grants.is_superuser
        changed.append("is_superuser")
    if changed:
        user.save(update_fields=changed)


def identity_sign_in(*, account: DirectoryAccount, policy: GroupPolicy) -> User:
    """The appliance account of this directory account, made on its first sign-in, its details,
    groups and flags brought up to date. An account an administrator deactivated here stays
    inactive (the caller refuses it); one the directory had made gone is active again."""
    now = timezone.now()
    with transaction.atomic():
        identity = (
            DirectoryIdentity.objects.select_for_update()
            .select_related("user")
            .filter(provider=account.provider, issuer=account.issuer, subject=account.subject)
            .first()
        )
        if identity is None:
            user = User(
                username=_free_username(account.username),
                email=account.email,
                first_name=account.first_name[:150],
                last_name=account.last_name[:150],
            )
            user.set_unusable_password()
            user.save()
            identity = DirectoryIdentity(
                user=user, provider=account.provider, issuer=account.issuer, subject=account.subject
            )
            logger.info("directory: new account %s for %s %s", user.username, account.provider, account.subject)
        else:
            user = identity.user
            user.email = account.email or user.email
            user.first_name = account.first_name[:150] or user.first_name
            user.last_name = account.last_name[:150] or user.last_name
            fields = ["email", "first_name", "last_name"]
            if identity.gone_at is not None:
                user.is_active = True
                fields.append("is_active")
            renamed = bool(account.username) and user.username != account.username
            # Renamed in the directory: follow it when the new name is free here.
            if renamed and not User.objects.filter(username__iexact=account.username).exclude(pk=user.pk).exists():
                user.username = account.username
                fields.append("username")
            user.save(update_fields=fields)
        identity.distinguished_name = account.distinguished_name[:1000]
        identity.directory_groups = list(account.groups)
        identity.last_signed_in_at = now
        identity.gone_at = None
        identity.save()
        _apply_grants(user, grants_for(account.groups, policy))
    return user


def identity_deactivate(*, identity: DirectoryIdentity) -> None:
    """The directory no longer knows this account: deactivate it and revoke its API tokens."""
    from api.models import ApiToken

    now = timezone.now()
    with transaction.atomic():
        User.objects.filter(pk=identity.user_id).update(is_active=False)
        ApiToken.objects.filter(user_id=identity.user_id, revoked_at__isnull=True).update(revoked_at=now)
        DirectoryIdentity.objects.filter(pk=identity.pk).update(gone_at=now, last_synced_at=now)
    logger.warning("directory: %s is no longer in the directory; deactivated", identity.user.username)


def identity_refresh(*, identity: DirectoryIdentity, groups: list[str], policy: GroupPolicy) -> bool:
    """The directory's groups read again for a linked account (a sync): its managed groups and
    flags brought in line. True if its groups changed."""
    with transaction.atomic():
        user = User.objects.select_for_update().get(pk=identity.user_id)
        before = set(user.groups.values_list("name", flat=True))
        _apply_grants(user, grants_for(groups, policy))
        changed = set(user.groups.values_list("name", flat=True)) != before
        DirectoryIdentity.objects.filter(pk=identity.pk).update(directory_groups=groups, last_synced_at=timezone.now())
    return changed


@dataclass
class SyncReport:
    checked: int = 0
    deactivated: list[str] = field(default_factory=list)
    groups_changed: list[str] = field(default_factory=list)


class SyncRefused(RuntimeError):
    """The directory answered with no account at all while accounts here are linked to it: a
    wrong search base or filter, not everyone leaving. Nothing is changed."""


def ldap_sync(*, directory, policy: GroupPolicy) -> SyncReport:
    """Bring every LDAP-linked account in line with the directory: groups and flags from its
    directory groups now, deactivated if the directory no longer lets it in. One search lists the
    accounts; the groups of each linked one are read on the same connection."""
    identities = list(DirectoryIdentity.objects.filter(provider=Provider.LDAP).select_related("user").order_by("pk"))
    report = SyncReport()
    if not identities:
        return report
    accounts = directory.accounts_by_id()
    if not accounts:
        raise SyncRefused(
            f"the directory lists no account under {directory.config.user_search_base} with the user filter, "
            f"while {len(identities)} account(s) here are linked to it; nothing was changed"
        )
    connection = directory.service_connection()
    try:
        for identity in identities:
            report.checked += 1
            account = accounts.get(identity.subject)
            if account is None:
                if identity.user.is_active or identity.gone_at is None:
                    identity_deactivate(identity=identity)
                    report.deactivated.append(identity.user.username)
                continue
            groups = directory.groups_of(account.dn, connection)
            if identity_refresh(identity=identity, groups=groups, policy=policy):
                report.groups_changed.append(identity.user.username)
            if identity.distinguished_name != account.dn:
                DirectoryIdentity.objects.filter(pk=identity.pk).update(distinguished_name=account.dn[:1000])
    finally:
        connection.unbind()
    logger.info(
        "directory: LDAP sync checked %d account(s); deactivated %s; groups changed for %s",
        report.checked,
        ", ".join(report.deactivated) or "none",
        ", ".join(report.groups_changed) or "none",
    )
    return report
