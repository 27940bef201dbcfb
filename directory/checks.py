"""``manage.py check --deploy``: a directory password must not cross the network in clear."""

from __future__ import annotations

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.security, deploy=True)
def ldap_passwords_are_encrypted(app_configs, **kwargs) -> list[checks.CheckMessage]:
    if settings.APPLIANCE_LDAP_START_TLS:
        return []
    plain = [url for url in settings.APPLIANCE_LDAP_URLS if not url.lower().startswith("ldaps://")]
    if not plain:
        return []
    return [
        checks.Warning(
            f"APPLIANCE_LDAP_URL names {', '.join(plain)} without TLS: people's directory passwords "
            f"and the service account's would cross the network in clear.",
            hint="Use ldaps:// URLs, or set APPLIANCE_LDAP_START_TLS=true (with APPLIANCE_LDAP_CA_FILE).",
            id="directory.W001",
        )
    ]
