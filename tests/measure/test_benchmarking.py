"""The helpers the benchmarks share to start and stop the appliance's processes
(``measure/benchmarking.py``)."""

from __future__ import annotations

import os
import subprocess

import pytest

from measure.benchmarking import stop_groups


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_group_whose_child_ignores_the_signal_is_killed_after_its_leader_exits():
    # The leader exits on SIGTERM; its child ignores it, as vLLM's engine core does while it
    # compiles the model when an engine host is stopped during its start.
    leader = subprocess.Popen(
        ["sh", "-c", "(trap '' TERM; sleep 60) & sleep 60"], start_new_session=True, stdout=subprocess.DEVNULL
    )
    try:
        stop_groups([leader], timeout_s=10, grace_s=0.5)
        assert leader.returncode is not None
        assert not _group_alive(leader.pid)
    finally:
        if _group_alive(leader.pid):
            os.killpg(leader.pid, 9)


def test_stopping_a_process_that_has_already_exited_is_quiet():
    done = subprocess.Popen(["true"], start_new_session=True)
    done.wait()
    stop_groups([done], timeout_s=1, grace_s=0.1)
    assert done.returncode == 0


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
