"""A zip of a folder opened safely (``documents.archives``, pure): what is taken, what is skipped
and why, and when the whole archive is refused."""

from __future__ import annotations

import io
import stat
import zipfile
from pathlib import Path

import pytest

from documents.archives import ArchiveLimits, ArchiveRefused, Member, Skipped, read_zip, unsafe_name_reason

LICENCES = Path("/usr/share/common-licenses")
LIMITS = ArchiveLimits(max_members=50, max_total_bytes=50 * 1024 * 1024, max_member_bytes=5 * 1024 * 1024)


def zip_of(entries: list, compression: int = zipfile.ZIP_DEFLATED) -> io.BytesIO:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as archive:
        for name, data in entries:
            archive.writestr(name, data)
    buffer.seek(0)
    return buffer


def outcome(buffer: io.BytesIO, limits: ArchiveLimits = LIMITS) -> tuple[dict[str, bytes], dict[str, str]]:
    taken: dict[str, bytes] = {}
    skipped: dict[str, str] = {}
    for entry in read_zip(buffer, limits=limits):
        if isinstance(entry, Member):
            taken[entry.name] = entry.data
        else:
            assert isinstance(entry, Skipped)
            skipped[entry.name] = entry.reason
    return taken, skipped


def test_documents_of_a_folder_are_taken_with_their_paths_and_bytes():
    gpl = (LICENCES / "GPL-3").read_bytes()
    apache = (LICENCES / "Apache-2.0").read_bytes()
    taken, skipped = outcome(
        zip_of([("licences/", b""), ("licences/GPL-3.txt", gpl), ("licences/x/Apache.md", apache)])
    )
    assert taken == {"licences/GPL-3.txt": gpl, "licences/x/Apache.md": apache}
    assert skipped == {}  # a folder entry is not a file


def test_hostile_and_unsupported_members_are_skipped_alone_with_their_reason():
    bsd = (LICENCES / "BSD").read_bytes()
    link = zipfile.ZipInfo("folder/link.txt")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    taken, skipped = outcome(
        zip_of(
            [
                ("folder/BSD.txt", bsd),
                ("../../etc/cron.d/evil.txt", b"* * * * * root rm -rf /"),
                ("/etc/passwd.txt", b"root:x:0:0"),
                ("C:/Windows/evil.txt", b"x"),
                ("folder/inner.zip", zip_of([("a.txt", b"nested")]).getvalue()),
                ("folder/photo.jpg", b"\xff\xd8\xff\xe0 not a document"),
                ("folder/Makefile", b"all:"),
                ("__MACOSX/folder/._BSD.txt", b"\0\5\26\7"),
                ("folder/zeros.txt", b"\0" * (8 * 1024 * 1024)),  # over the per-file limit
                ("folder/dense.txt", b"\0" * (3 * 1024 * 1024)),  # within it, but compressed ~1000 times
                ("folder/empty.txt", b""),
                (link, b"/etc/shadow"),
            ]
        )
    )
    assert taken == {"folder/BSD.txt": bsd}
    assert "climbs out of the folder" in skipped["../../etc/cron.d/evil.txt"]
    assert "absolute path" in skipped["/etc/passwd.txt"] and "absolute path" in skipped["C:/Windows/evil.txt"]
    assert "nested archives are not opened" in skipped["folder/inner.zip"]
    assert "“.jpg” files are not a document type" in skipped["folder/photo.jpg"]
    assert "no extension" in skipped["folder/Makefile"]
    assert "metadata" in skipped["__MACOSX/folder/._BSD.txt"]
    assert "at most 5.0 MB" in skipped["folder/zeros.txt"]
    assert "compressed" in skipped["folder/dense.txt"] and "zip bomb" in skipped["folder/dense.txt"]
    assert "empty" in skipped["folder/empty.txt"]
    assert "symbolic link" in skipped["folder/link.txt"]


def test_a_member_whose_bytes_are_not_what_the_archive_declares_is_refused():
    data = (LICENCES / "GPL-2").read_bytes()
    raw = bytearray(zip_of([("GPL-2.txt", data)], compression=zipfile.ZIP_STORED).getvalue())
    # The central directory (what zipfile trusts) says 100 bytes; 18 KB are stored.
    central = raw.rfind(b"PK\x01\x02")
    raw[central + 20 : central + 28] = (100).to_bytes(4, "little") * 2
    taken, skipped = outcome(io.BytesIO(bytes(raw)))
    assert not taken
    assert "damaged" in skipped["GPL-2.txt"] or "more than the archive declares" in skipped["GPL-2.txt"]


def test_too_many_members_or_too_much_unpacked_refuses_the_whole_archive():
    many = zip_of([(f"f{i}.txt", b"x") for i in range(51)])
    with pytest.raises(ArchiveRefused, match="holds 51 files; one archive may hold at most 50"):
        list(read_zip(many, limits=LIMITS))
    heavy = zip_of([(f"f{i}.txt", b"\0" * (4 * 1024 * 1024)) for i in range(3)])
    with pytest.raises(ArchiveRefused, match="unpacks to 12.0 MB"):
        list(read_zip(heavy, limits=ArchiveLimits(max_total_bytes=10 * 1024 * 1024)))
    with pytest.raises(ArchiveRefused, match="not a zip archive"):
        list(read_zip(io.BytesIO(b"PK\x03\x04 but then garbage"), limits=LIMITS))


@pytest.mark.parametrize(
    ("name", "safe"),
    [("a/b.txt", True), ("a/../b.txt", False), ("..\\b.txt", False), ("/abs.txt", False), ("ok..txt", True)],
)
def test_unsafe_names(name, safe):
    assert (unsafe_name_reason(name) == "") is safe


def test_a_damaged_member_of_any_compression_method_is_skipped_alone():
    gpl = (LICENCES / "GPL-3").read_bytes()
    raw = bytearray(zip_of([("a.txt", gpl), ("b.txt", gpl[:5000])], compression=zipfile.ZIP_LZMA).getvalue())
    # a.txt's LZMA properties (after the 30-byte local header, its name and LZMA's 4-byte header)
    # made nonsense: the lzma module raises its own error, which stopped the whole batch (a 500).
    start = 30 + len("a.txt") + 4
    raw[start : start + 5] = b"\xff" * 5
    taken, skipped = outcome(io.BytesIO(bytes(raw)))
    assert taken == {"b.txt": gpl[:5000]}
    assert "damaged" in skipped["a.txt"]


def test_an_archive_the_zip_reader_cannot_open_for_any_reason_is_refused_with_a_reason():
    raw = bytearray(zip_of([("a.txt", b"some text")]).getvalue())
    central = raw.rfind(b"PK\x01\x02")
    raw[central + 6 : central + 8] = (228).to_bytes(2, "little")  # "needs zip version 22.8": NotImplementedError
    with pytest.raises(ArchiveRefused, match="not a zip archive the appliance can read"):
        list(read_zip(io.BytesIO(bytes(raw)), limits=LIMITS))


def test_a_table_of_contents_larger_than_the_file_limit_needs_is_refused_before_it_is_loaded():
    # 300 entries with long names: a table of some 90 KB, where 10 files need at most 43 KB.
    archive = zip_of([(f"{'n' * 250}{i}.txt", b"x") for i in range(300)])
    with pytest.raises(ArchiveRefused, match="table of contents is 0.1 MB, more than 10 files need"):
        list(read_zip(archive, limits=ArchiveLimits(max_members=10)))
    # The same count of short names is refused by the count, after the table is read.
    with pytest.raises(ArchiveRefused, match="holds 300 files"):
        list(read_zip(zip_of([(f"{i}.txt", b"x") for i in range(300)]), limits=ArchiveLimits(max_members=10)))
