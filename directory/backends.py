"""The LDAP / Active Directory sign-in backend, after Django's own (local accounts) in
``AUTHENTICATION_BACKENDS``.

A directory account signs in with its directory password only: its appliance account has no
usable password, so Django's backend never lets it in. If the directory does not answer, the
sign-in fails like a wrong password (and is logged); local accounts still sign in.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.contrib.auth.backends import ModelBackend

from directory import services
from directory.ldap import LdapDirectory, LdapError
from directory.mapping import GroupPolicy
from directory.models import Provider

logger = logging.getLogger(__name__)


def ldap_policy() -> GroupPolicy:
    return GroupPolicy(
        group_map=settings.APPLIANCE_LDAP_GROUP_MAP,
        staff_groups=settings.APPLIANCE_LDAP_STAFF_GROUPS,
        superuser_groups=settings.APPLIANCE_LDAP_SUPERUSER_GROUPS,
    )


class LdapBackend(ModelBackend):
    """Search the account by its user name, bind as it with the password, then sign in its
    appliance account (made on the first sign-in, linked by entryUUID / objectGUID)."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if not settings.APPLIANCE_LDAP_URLS or username is None or password is None:
            return None
        directory = LdapDirectory.from_settings()
        try:
            account = directory.find(username)
            if account is None or not directory.password_matches(account, password):
                return None
            groups = directory.groups_of(account.dn)
        except LdapError as exc:
            logger.error("LDAP sign-in of %r failed: the directory did not answer as expected: %s", username, exc)
            return None
        user = services.identity_sign_in(
            account=services.DirectoryAccount(
                provider=Provider.LDAP,
                subject=account.id,
                username=account.username or username,
                groups=tuple(groups),
                email=account.email,
                first_name=account.first_name,
                last_name=account.last_name,
                distinguished_name=account.dn,
            ),
            policy=ldap_policy(),
        )
        return user if self.user_can_authenticate(user) else None
