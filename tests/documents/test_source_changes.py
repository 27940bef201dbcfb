"""The pure decisions of a source's poll (``documents.source_changes``): which files to read,
which came back, which were removed, which to leave settling; which UIDs a mailbox poll takes."""

from __future__ import annotations

import pytest

from documents.source_changes import (
    FolderLooksUnmounted,
    Listed,
    Seen,
    folder_changes,
    item_key,
    mailbox_plan,
    poll_summary,
    wanted,
)

SECOND = 1_000_000_000
NOW = 1_800_000_000 * SECOND
OLD = NOW - 3600 * SECOND
SUFFIXES = (".pdf", ".txt", ".docx", ".eml", ".md")


def test_new_files_are_read_and_unchanged_ones_are_not_even_hashed():
    seen = {"a.pdf": Seen(100, OLD, present=True)}
    listed = {"a.pdf": Listed(100, OLD), "b.pdf": Listed(5, OLD), "sub/c.txt": Listed(7, OLD)}
    changes = folder_changes(seen, listed, now_ns=NOW, settle_ns=30 * SECOND)
    assert changes.to_read == ["b.pdf", "sub/c.txt"]
    assert changes.back == changes.removed == changes.settling == []


def test_a_file_whose_size_or_time_changed_is_read_again():
    seen = {"a.pdf": Seen(100, OLD, present=True), "b.pdf": Seen(5, OLD, present=True)}
    listed = {"a.pdf": Listed(101, OLD), "b.pdf": Listed(5, OLD + SECOND)}
    assert folder_changes(seen, listed, now_ns=NOW, settle_ns=0).to_read == ["a.pdf", "b.pdf"]


def test_a_file_gone_is_removed_and_one_back_unchanged_is_present_again_without_reading():
    seen = {
        "gone.pdf": Seen(1, OLD, present=True),
        "back.pdf": Seen(2, OLD, present=False),
        "x.txt": Seen(3, OLD, True),
    }
    listed = {"back.pdf": Listed(2, OLD), "x.txt": Listed(3, OLD)}
    changes = folder_changes(seen, listed, now_ns=NOW, settle_ns=0)
    assert changes.removed == ["gone.pdf"] and changes.back == ["back.pdf"] and changes.to_read == []


def test_a_file_back_with_other_bytes_is_read():
    seen = {"back.pdf": Seen(2, OLD, present=False)}
    changes = folder_changes(seen, {"back.pdf": Listed(3, OLD)}, now_ns=NOW, settle_ns=0)
    assert changes.to_read == ["back.pdf"] and changes.back == []


def test_a_file_still_being_copied_is_left_for_the_next_poll_and_not_removed():
    seen = {"big.pdf": Seen(10, OLD, present=True)}
    listed = {"big.pdf": Listed(20, NOW - SECOND), "new.pdf": Listed(5, NOW - 2 * SECOND)}
    changes = folder_changes(seen, listed, now_ns=NOW, settle_ns=30 * SECOND)
    assert changes.settling == ["big.pdf", "new.pdf"] and changes.to_read == [] and changes.removed == []


def test_an_empty_listing_where_files_were_is_taken_for_an_unmounted_share():
    with pytest.raises(FolderLooksUnmounted):
        folder_changes({"a.pdf": Seen(1, OLD, present=True)}, {}, now_ns=NOW, settle_ns=0)
    # Files already marked removed, or a folder never seen with files: an empty folder is fine.
    assert folder_changes({"a.pdf": Seen(1, OLD, present=False)}, {}, now_ns=NOW, settle_ns=0).removed == []
    assert folder_changes({}, {}, now_ns=NOW, settle_ns=0).to_read == []


@pytest.mark.parametrize(
    ("path", "taken"),
    [
        ("contract.pdf", True),
        ("2019/Letters/reply.DOCX", True),
        ("notes.md", True),
        ("photo.png", False),
        (".hidden.pdf", False),
        (".git/objects/x.txt", False),
        ("~$contract.docx", False),
        (".~lock.contract.docx#", False),
        ("download.pdf.part", False),
        ("report.tmp", False),
    ],
)
def test_only_documents_the_appliance_reads_are_taken_by_default(path, taken):
    assert wanted(path, patterns=[], suffixes=SUFFIXES) is taken


def test_include_patterns_match_the_path_in_the_folder_or_the_name():
    patterns = ["contracts/*", "*.eml"]
    assert wanted("contracts/a.pdf", patterns=patterns, suffixes=SUFFIXES)
    assert wanted("mail/2020/x.eml", patterns=patterns, suffixes=SUFFIXES)
    assert not wanted("letters/a.pdf", patterns=patterns, suffixes=SUFFIXES)
    assert not wanted("contracts/.a.pdf", patterns=patterns, suffixes=SUFFIXES)


def test_a_mailbox_is_read_from_the_uid_after_the_last_taken_oldest_first():
    plan = mailbox_plan(known_uidvalidity=7, last_uid=10, uidvalidity=7, found_uids=[14, 11, 12], limit=100)
    assert plan.uids == [11, 12, 14] and not plan.restart and plan.more == 0


def test_the_highest_uid_the_server_adds_to_n_star_is_not_taken_again():
    # `UID SEARCH UID 11:*` with no message above 10 answers 10.
    plan = mailbox_plan(known_uidvalidity=7, last_uid=10, uidvalidity=7, found_uids=[10], limit=100)
    assert plan.uids == []


def test_a_new_uidvalidity_reads_the_mailbox_again_from_its_first_message():
    plan = mailbox_plan(known_uidvalidity=7, last_uid=10, uidvalidity=8, found_uids=[1, 2, 3], limit=100)
    assert plan.uids == [1, 2, 3] and plan.restart
    first = mailbox_plan(known_uidvalidity=None, last_uid=0, uidvalidity=8, found_uids=[3, 1], limit=100)
    assert first.uids == [1, 3] and first.restart


def test_a_poll_takes_at_most_its_limit_and_says_how_many_wait():
    plan = mailbox_plan(known_uidvalidity=1, last_uid=0, uidvalidity=1, found_uids=range(1, 251), limit=100)
    assert plan.uids == list(range(1, 101)) and plan.more == 150


def test_item_keys_and_summaries():
    assert item_key(7, 42) == "7:42"
    assert poll_summary({"new": 3, "changed": 0, "removed": 2}) == "3 new, 2 removed"
    assert poll_summary({"new": 0}) == "nothing new"
