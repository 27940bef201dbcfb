"""``manage.py directory``: what an administrator connecting the appliance to a directory runs.

manage.py directory check [USER NAME]   bind as the service account, count the accounts the
                                        user filter lets in and, for USER NAME, show its DN,
                                        stable id, groups and what the mapping grants it
manage.py directory sync                run the LDAP and OIDC syncs now and say what changed
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from directory import oidc, services
from directory.backends import ldap_policy
from directory.ldap import LdapDirectory, LdapError
from directory.mapping import grants_for


class Command(BaseCommand):
    help = "Check the directory settings against the directory, or run the syncs now."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        check = sub.add_parser("check", help="bind, search, and show what a user name would get")
        check.add_argument("username", nargs="?")
        sub.add_parser("sync", help="run the LDAP and OpenID Connect syncs now")

    def handle(self, *args, **options):
        if options["action"] == "check":
            self._check(options.get("username"))
        else:
            self._sync()

    def _check(self, username: str | None) -> None:
        if not settings.APPLIANCE_LDAP_URLS:
            raise CommandError("LDAP sign-in is off: APPLIANCE_LDAP_URL is not set")
        directory = LdapDirectory.from_settings()
        try:
            accounts = directory.accounts_by_id()
        except LdapError as exc:
            raise CommandError(f"the directory refused or did not answer: {exc}") from exc
        self.stdout.write(
            f"bound as {directory.config.bind_dn or 'anonymous'} to {', '.join(directory.config.urls)}; "
            f"{len(accounts)} account(s) under {directory.config.user_search_base} may sign in"
        )
        if not username:
            return
        account = directory.find(username)
        if account is None:
            raise CommandError(f"no single account named {username!r} is let in by the user filter")
        groups = directory.groups_of(account.dn)
        grants = grants_for(groups, ldap_policy())
        self.stdout.write(f"{username}: {account.dn}\n  {directory.config.id_attribute}: {account.id}")
        self.stdout.write("  directory groups: " + ("; ".join(groups) or "none"))
        self.stdout.write("  appliance groups: " + (", ".join(sorted(grants.groups)) or "none"))
        flags = {"staff": grants.is_staff, "superuser": grants.is_superuser}
        self.stdout.write(
            "  "
            + ", ".join(
                f"{name}: {'not decided here' if v is None else 'yes' if v else 'no'}" for name, v in flags.items()
            )
        )

    def _sync(self) -> None:
        ran = False
        if settings.APPLIANCE_LDAP_URLS:
            try:
                report = services.ldap_sync(directory=LdapDirectory.from_settings(), policy=ldap_policy())
            except (LdapError, services.SyncRefused) as exc:
                raise CommandError(f"LDAP sync: {exc}") from exc
            self._report("LDAP", report)
            ran = True
        if oidc.enabled():
            self._report("OpenID Connect", oidc.oidc_sync())
            ran = True
        if not ran:
            raise CommandError("no directory is configured (APPLIANCE_LDAP_URL, APPLIANCE_OIDC_DISCOVERY_URL)")

    def _report(self, name: str, report: services.SyncReport) -> None:
        self.stdout.write(
            f"{name}: {report.checked} account(s) checked; deactivated: {', '.join(report.deactivated) or 'none'}; "
            f"groups changed: {', '.join(report.groups_changed) or 'none'}"
        )
