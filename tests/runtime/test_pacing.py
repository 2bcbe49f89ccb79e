"""runtime.pacing: a paced computation waits before its calls."""

import time

import pytest

from ssaexec.runtime import pacing


def _burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_paced_call_waits_until_the_thread_has_taken_its_share():
    pace = pacing.Pace(0.5)
    _burn(0.02)
    cpu = time.thread_time() - pace.cpu0
    add = pacing.between(lambda a, b=0: a + b, pace)
    assert add(2, b=3) == 5
    # waited first: a lower bound only (a sleep never ends early), no timing beyond it
    assert time.monotonic() - pace.wall0 >= cpu / 0.5


def test_the_share_is_checked():
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="share must be in"):
            pacing.Pace(bad)
