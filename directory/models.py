"""Which directory account an appliance account belongs to, by an id the directory never reuses.

A user name can be given to someone else after its owner left; an LDAP entry's ``entryUUID``
(Active Directory's ``objectGUID``) and an OpenID Connect provider's ``iss`` + ``sub`` cannot. So
an account is found by its identity here, never by its name: a new person who gets a departed
colleague's name in the directory gets a new account, not the old one's documents. Accounts
without an identity are local (the embedded administrator, a break-glass account).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Provider(models.TextChoices):
    LDAP = "ldap", "LDAP / Active Directory"
    OIDC = "oidc", "OpenID Connect"


class DirectoryIdentity(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="directory_identity")
    provider = models.CharField(max_length=8, choices=Provider.choices)
    # OIDC: the provider's ``iss``; LDAP: empty (an entryUUID / objectGUID is unique by itself).
    issuer = models.CharField(max_length=500, blank=True)
    # LDAP: the entry's UUID (entryUUID, or objectGUID written as a UUID); OIDC: ``sub``.
    subject = models.CharField(max_length=255)
    # The entry's DN when last seen (LDAP), for people reading the admin; not used to find it.
    distinguished_name = models.CharField(max_length=1000, blank=True)
    # The directory groups last read for the account (as the directory writes them).
    directory_groups = models.JSONField(default=list, blank=True)
    # OIDC: the provider's refresh token, sealed with a key derived from SECRET_KEY (directory.oidc),
    # which the OIDC sync uses to ask the provider whether the account still exists and its groups.
    refresh_token_sealed = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_signed_in_at = models.DateTimeField(null=True, blank=True)
    last_synced_at = models.DateTimeField(null=True, blank=True)
    # When the directory stopped knowing the account (disabled, deleted, no longer matching the
    # filter): the appliance account was deactivated then. Cleared when it signs in again.
    gone_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "directory identity"
        verbose_name_plural = "directory identities"
        constraints = [
            models.UniqueConstraint(fields=["provider", "issuer", "subject"], name="directory_identity_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.get_provider_display()}: {self.subject}"
