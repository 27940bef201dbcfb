"""The group mapping (directory.mapping, pure): what an account's directory groups grant here."""

from __future__ import annotations

import pytest

from directory.mapping import GroupPolicy, MappingError, grants_for, group_key, parse_group_list, parse_group_map


def test_dns_are_compared_as_ldap_compares_them():
    assert group_key("CN=Legal, OU=Groups,DC=Example,DC=org") == "cn=legal,ou=groups,dc=example,dc=org"
    mapping = parse_group_map('{"CN=Legal, OU=Groups,DC=example,DC=org": "Legal"}', setting="X")
    policy = GroupPolicy(group_map=mapping)
    assert grants_for(["cn=legal,ou=groups,dc=example,dc=org"], policy).groups == {"Legal"}


def test_one_directory_group_may_grant_several_and_several_one():
    mapping = parse_group_map('{"hr": ["HR", "Legal"], "legal": "Legal"}', setting="X")
    policy = GroupPolicy(group_map=mapping)
    grants = grants_for(["HR", "unmapped"], policy)
    assert grants.groups == {"HR", "Legal"}
    assert grants.managed_groups == {"HR", "Legal"}
    assert grants_for([], policy).groups == frozenset()


def test_staff_and_superuser_are_decided_only_when_configured():
    plain = GroupPolicy(group_map={})
    assert grants_for(["admins"], plain).is_staff is None and grants_for(["admins"], plain).is_superuser is None
    policy = GroupPolicy(group_map={}, staff_groups=parse_group_list("cn=staff,dc=x; cn=ops,dc=x"),
                         superuser_groups=parse_group_list("cn=admins,dc=x"))  # fmt: skip
    assert grants_for(["CN=Ops,DC=x"], policy).is_staff is True
    assert grants_for(["cn=nobody,dc=x"], policy).is_staff is False
    superuser = grants_for(["cn=admins,dc=x"], policy)
    assert superuser.is_superuser is True and superuser.is_staff is True


@pytest.mark.parametrize("text", ["[1, 2]", '{"a": 3}', '{"a": [""]}', "{oops"])
def test_a_mapping_that_is_not_a_mapping_is_refused_at_start(text):
    with pytest.raises(MappingError, match="APPLIANCE_LDAP_GROUP_MAP"):
        parse_group_map(text, setting="APPLIANCE_LDAP_GROUP_MAP")


def test_no_mapping_is_an_empty_one():
    assert parse_group_map(None, setting="X") == {} and parse_group_map("  ", setting="X") == {}
