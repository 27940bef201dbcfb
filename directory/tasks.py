"""The periodic syncs (Celery beat): LDAP every ``APPLIANCE_LDAP_SYNC_INTERVAL_S``, OpenID Connect
(by each account's refresh token) every ``APPLIANCE_OIDC_SYNC_INTERVAL_S``. Someone removed from a
group, disabled or deleted in the directory loses that here within the interval, signed in or
not. They run on the ingest queue (a few requests; no engine)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

logger = logging.getLogger(__name__)


@shared_task(name="directory.tasks.ldap_sync", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def ldap_sync() -> None:
    from directory import services
    from directory.backends import ldap_policy
    from directory.ldap import LdapDirectory

    if not settings.APPLIANCE_LDAP_URLS:
        return
    services.ldap_sync(directory=LdapDirectory.from_settings(), policy=ldap_policy())


@shared_task(name="directory.tasks.oidc_sync", acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def oidc_sync() -> None:
    from directory import oidc

    if not oidc.enabled():
        return
    oidc.oidc_sync()
