"""runtime.pacing: a paced thread's imports wait their turn; nobody else's do."""

import sys
import threading
import time

import pytest

from ssaexec.runtime import pacing

_BURN = "import time\nend = time.thread_time() + {s}\nwhile time.thread_time() < end:\n    pass\n"


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Write modules ``name -> source`` on a fresh path entry; forget them afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    written = []

    def write(**sources):
        for name, text in sources.items():
            (tmp_path / f"{name}.py").write_text(text)
            written.append(name)
    yield write
    for name in written:
        sys.modules.pop(name, None)


def test_a_paced_threads_imports_take_at_most_their_share_of_the_time(modules):
    modules(pace_burn=_BURN.format(s=0.05), pace_after="X = 1\n")
    share = 0.25
    wall0, cpu0 = time.monotonic(), time.thread_time()
    with pacing.paced(share):
        import pace_burn  # noqa: F401 - 0.05 s of CPU
        cpu = time.thread_time() - cpu0
        import pace_after  # waits first: until the wall time is cpu / share
    # a lower bound only (a sleep never ends early): no timing is asserted beyond it
    assert time.monotonic() - wall0 >= cpu / share
    assert pacing._FINDER not in sys.meta_path
    # the loader's own exec_module again once the module is imported
    assert "exec_module" not in vars(sys.modules["pace_after"].__spec__.loader)


def test_only_the_paced_thread_is_paced(modules):
    modules(pace_other="Y = 2\n")
    inside, leave = threading.Event(), threading.Event()

    def paced_thread():
        with pacing.paced(0.1):
            inside.set()
            leave.wait(30)
    t = threading.Thread(target=paced_thread)
    t.start()
    try:
        assert inside.wait(30) and pacing._FINDER in sys.meta_path
        assert pacing._FINDER.find_spec("pace_other", None) is None  # this thread: not paced
        import pace_other
        assert pace_other.Y == 2 and "exec_module" not in vars(pace_other.__spec__.loader)
    finally:
        leave.set()
        t.join(30)
    assert pacing._FINDER not in sys.meta_path


def test_a_pace_waits_before_each_wrapped_call():
    pace = pacing.Pace(0.5)
    end = time.thread_time() + 0.02
    while time.thread_time() < end:
        pass
    cpu = time.thread_time() - pace.cpu0
    add = pacing.between(lambda a, b=0: a + b, pace)
    assert add(2, b=3) == 5  # waited first: the wall time since is cpu / share at least
    assert time.monotonic() - pace.wall0 >= cpu / 0.5
    with pytest.raises(ValueError, match="share must be in"):
        pacing.Pace(0)
    with pytest.raises(ValueError, match="share must be in"):
        with pacing.paced(1.5):
            pass
