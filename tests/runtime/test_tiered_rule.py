"""runtime.tiered's rule for starting a cold background compile: only beside a free core.

Pure parts only (no executor, no background work): `make test` runs them; the tiers end to
end are tests/runtime/test_tiered.py's (`make test-tiered`)."""

from ssaexec.runtime import tiered
from ssaexec.runtime.tiered import DEFER_SAY, FREE_CORE, TieredLowering, compile_beside


def test_a_cold_compile_starts_only_beside_a_free_core():
    assert compile_beside(1.0, 2)  # one core of two busy (a launch-bound step)
    assert compile_beside(2 - FREE_CORE, 2)
    assert not compile_beside(1.9, 2)  # a kernel-bound step on every core
    assert not compile_beside(1.0, 1)
    assert not compile_beside(None, 16)  # not measured yet: the first step records


def test_the_lowering_measures_its_straight_steps_and_says_a_deferral_once(monkeypatch):
    monkeypatch.setattr(tiered, "cores", lambda: 2)
    notes = []
    low = TieredLowering(notes=notes)
    assert not low.may_compile() and low.deferred == 0  # nothing measured: no count
    for step in range(3):
        low.begun = step + 1
        low.end_step(0.010, 0.0195)  # 1.95 cores busy
    assert list(low.busy) == [1.95, 1.95]  # step 1 (recording) left out
    for _ in range(DEFER_SAY + 5):
        assert not low.may_compile()
    assert low.deferred == DEFER_SAY + 5
    said = [n for n in notes if "keeps the straight-line path" in n]
    assert len(said) == 1 and "1.9 of 2 cores busy" in said[0], notes
    for _ in range(5):  # the load falls: a core is free again
        low.end_step(0.010, 0.010)
    assert low.may_compile()


def test_several_processes_count_their_share_of_the_cores_over_a_full_window(monkeypatch):
    monkeypatch.setattr(tiered, "cores", lambda: 2)
    monkeypatch.setattr(tiered, "COMPILE_BESIDE", "auto")
    notes = []
    low = TieredLowering(notes=notes, local_processes=2)  # two ranks on this machine
    assert low.share == 1.0
    low.begun = 2
    low.end_step(0.010, 0.003)  # step 2: waiting for the peer, still recording
    assert not low.may_compile() and low.deferred == 0  # one step is not a window
    for _ in range(low.busy.maxlen - 1):
        low.end_step(0.010, 0.009)  # 0.9 of its share: nothing free for a compile
    assert not low.may_compile() and low.deferred == 1
    for _ in range(DEFER_SAY):
        low.may_compile()
    said = [n for n in notes if "keeps the straight-line path" in n]
    assert len(said) == 1 and "share of the cores (1 of 2)" in said[0], notes
    for _ in range(low.busy.maxlen):  # it waits for its peer: that is not free time
        low.end_step(0.010, 0.003)
    assert not low.may_compile()
    monkeypatch.setattr(tiered, "cores", lambda: 4)  # two ranks on 4 cores: 2 each
    low = TieredLowering(local_processes=2)
    low.begun = 2
    for _ in range(low.busy.maxlen):
        low.end_step(0.010, 0.009)
    assert low.share == 2.0 and low.may_compile()
    # one process on the machine keeps every core (the rule above)
    assert TieredLowering(local_processes=1).share == 4


def test_compile_beside_always_starts_a_cold_compile_whatever_the_load(monkeypatch):
    monkeypatch.setattr(tiered, "cores", lambda: 2)
    monkeypatch.setattr(tiered, "COMPILE_BESIDE", "always")
    low = TieredLowering(local_processes=2)
    assert low.may_compile()  # not even measured
    low.end_step(0.010, 0.0199)
    assert low.may_compile() and low.deferred == 0
