"""The helpers the benchmarks share (``measure/benchmarking.py``); starting and stopping
processes is ``appliance.processes``' (tests/appliance/test_processes.py)."""

from __future__ import annotations

import os

import pytest


@pytest.mark.django_db
def test_a_measuring_account_is_made_without_a_password_and_a_persons_is_refused(django_user_model):
    from django.core.management.base import CommandError

    from measure.benchmarking import api_bench_user

    made = api_bench_user("bench-probe", deletes="jobs")
    assert made.is_active and not made.has_usable_password()
    django_user_model.objects.create_user("carol", password="a long passphrase")
    with pytest.raises(CommandError, match="A person's account is called 'carol'.*deletes its jobs"):
        api_bench_user("carol", deletes="jobs")
    assert django_user_model.objects.get(username="carol").has_usable_password()  # left alone


def test_a_sigterm_ends_a_long_command_through_its_cleanup_and_the_handler_is_put_back():
    import signal
    import time

    from measure.benchmarking import sigterm_as_exit

    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(SystemExit) as stopped, sigterm_as_exit():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler's exception interrupts it
        finally:
            cleaned.append(True)  # what stops the engine host and workers runs
    assert stopped.value.code == 128 + signal.SIGTERM and cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_second_sigterm_does_not_cut_the_cleanup_of_the_first_short():
    import signal

    from measure.benchmarking import sigterm_as_exit

    cleaned = []
    with pytest.raises(SystemExit), sigterm_as_exit():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # while the engine host and workers are being stopped
            cleaned.append("after the second")
    assert cleaned == ["after the second"]


def test_real_paragraphs_are_read_in_a_reproducible_order(tmp_path):
    from measure.benchmarking import real_paragraphs

    (tmp_path / "B-licence").write_text("Short.\n\nThe second file's only paragraph, long enough to be kept here.\n")
    (tmp_path / "A-licence").write_text(
        "The first paragraph of the first file,\nwrapped over two lines of text.\n\n  \n"
        "Its second paragraph, also long enough to be kept as one.\n"
    )
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00 not text")
    (tmp_path / "C-same-as-A").symlink_to(tmp_path / "A-licence")  # read once, under its first name
    assert real_paragraphs(tmp_path) == [
        "The first paragraph of the first file, wrapped over two lines of text.",
        "Its second paragraph, also long enough to be kept as one.",
        "The second file's only paragraph, long enough to be kept here.",
    ]
    assert real_paragraphs(tmp_path / "missing") == []


def test_a_real_passage_is_consecutive_paragraphs_within_its_words_and_never_empty():
    from measure.benchmarking import real_passage

    paragraphs = ["one two three", "four five", "six seven eight nine ten", "eleven"]
    assert real_passage(paragraphs, 0, words=5) == "one two three\n\nfour five"
    assert real_passage(paragraphs, 3, words=4) == "eleven\n\none two three"  # goes round
    assert real_passage(paragraphs, 2, words=3) == "six seven eight"  # a long first one is cut
    assert real_passage(paragraphs, 1, words=100) == "four five\n\nsix seven eight nine ten\n\neleven\n\none two three"
