"""What a directory's groups grant here: appliance groups, staff, superuser. Pure: no Django.

The operator writes a mapping from directory groups (LDAP group DNs, or the values of an OpenID
Connect claim) to appliance groups (the Django groups documents are shared with), as JSON:

    {"cn=legal,ou=groups,dc=example,dc=org": "Legal", "cn=hr,ou=groups,dc=example,dc=org": ["HR", "Legal"]}

Every appliance group named in the mapping is *managed*: at each sign-in (and each LDAP sync) a
directory account is in exactly those managed groups its directory groups map to, so leaving a
group in the directory leaves it here. Groups the mapping does not name are left as an
administrator set them. DNs are compared as LDAP compares them, case-insensitively and without
the spaces around separators (``CN=Legal, OU=Groups`` is ``cn=legal,ou=groups``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass


class MappingError(ValueError):
    """A group mapping that is not a JSON object of names to a name or a list of names."""


_SEPARATOR_SPACES = re.compile(r"\s*([,=+])\s*")


def group_key(name: str) -> str:
    """A directory group's name as compared: a DN's case and separator spacing do not count."""
    return _SEPARATOR_SPACES.sub(r"\1", name.strip()).casefold()


def parse_group_map(text: str | None, *, setting: str) -> dict[str, tuple[str, ...]]:
    """The mapping in ``text`` (JSON), keyed by ``group_key``; empty for None or an empty text."""
    if text is None or not text.strip():
        return {}
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MappingError(f"{setting} is not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(raw, dict):
        raise MappingError(f"{setting} must be a JSON object of directory group to appliance group(s)")
    mapping: dict[str, tuple[str, ...]] = {}
    for directory_group, targets in raw.items():
        names = [targets] if isinstance(targets, str) else targets
        if not isinstance(names, list) or not all(isinstance(n, str) and n.strip() for n in names):
            raise MappingError(f"{setting}: {directory_group!r} must map to a group name or a list of names")
        key = group_key(directory_group)
        mapping[key] = tuple(dict.fromkeys((*mapping.get(key, ()), *(n.strip() for n in names))))
    return mapping


def parse_group_list(text: str | None) -> frozenset[str]:
    """Directory groups separated by semicolons (a DN holds commas), keyed by ``group_key``."""
    if text is None:
        return frozenset()
    return frozenset(group_key(part) for part in text.split(";") if part.strip())


@dataclass(frozen=True)
class GroupPolicy:
    """One sign-in method's rules: the mapping, and which directory groups make staff and superusers.

    ``staff_groups`` and ``superuser_groups`` decide those flags only when they are set; left
    empty, the flags stay as an administrator set them here."""

    group_map: dict[str, tuple[str, ...]]
    staff_groups: frozenset[str] = frozenset()
    superuser_groups: frozenset[str] = frozenset()

    @property
    def managed_groups(self) -> frozenset[str]:
        return frozenset(name for names in self.group_map.values() for name in names)


@dataclass(frozen=True)
class Grants:
    """What one account's directory groups give it here. ``is_staff`` / ``is_superuser`` are None
    when the policy leaves them alone."""

    groups: frozenset[str]
    managed_groups: frozenset[str]
    is_staff: bool | None
    is_superuser: bool | None


def grants_for(directory_groups: Iterable[str], policy: GroupPolicy) -> Grants:
    keys = {group_key(g) for g in directory_groups}
    groups = frozenset(name for key in keys for name in policy.group_map.get(key, ()))
    is_superuser = bool(keys & policy.superuser_groups) if policy.superuser_groups else None
    is_staff: bool | None = bool(keys & policy.staff_groups) if policy.staff_groups else None
    if is_superuser:
        is_staff = True  # the admin is for staff; a superuser who could not open it would be odd
    return Grants(groups=groups, managed_groups=policy.managed_groups, is_staff=is_staff, is_superuser=is_superuser)
