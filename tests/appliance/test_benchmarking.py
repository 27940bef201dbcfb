"""The helpers the benchmarks share to start and stop the appliance's processes
(``appliance/benchmarking.py``)."""

from __future__ import annotations

import os
import subprocess

from appliance.benchmarking import stop_groups


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
