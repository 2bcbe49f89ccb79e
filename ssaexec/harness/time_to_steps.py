"""Time to N training steps, compile included: what a compile costs before it pays back.

A mode's steady-state images/sec hides its compile. What a user waits for is the wall
time from building the trainer (the program, the executor, a blocking compile) to the end
of step N. Policy, one definition for ``ssaexec bench`` (the ``to N`` columns) and
``bench/time_to_steps.py`` (each mode in a fresh process, every step run; it reads the
switch with ``tier_report`` and the steps with ``to_step``):

* **measured** where the steps were run: ``to_step(ends, t0)`` takes the end time of
  every untimed step a worker ran (those that compiled, the warm-up, and under the default
  ``compiler="auto"`` every step until the runner switched to its compiled segments);
* **estimated** beyond them (``time_to``): the last measured step's time plus the steady
  step time (the median timed window) for each further step. For a blocking compile
  (torch.compile, ``compiler="inductor"``) the compile sits inside the measured steps; for
  the tiered default the steps before the switch ran at the straight-line speed while it
  compiled in the background, and the estimate goes on at the compiled speed. The harness
  prints an estimated figure with ``~``.
* imports (torch, ssaexec) are not counted: every mode pays them alike. A DDP group's time
  includes starting its other processes, which a user of DDP pays.

``tier_report(pe)`` reads what the tiered runners of a ``ParallelExecutor`` did: the step
they switched at, the background compile's seconds (and by phase), the step time before
and after. None where no runner is tiered (``compiler=None`` or ``"inductor"``, or
``"auto"`` where it runs no tiers).
"""

import statistics

__all__ = ["TIME_TO", "SETTLE_S", "places_settled", "tier_report", "to_step", "steady_step_s",
           "time_to"]

# the N of the ``to N`` columns of ``ssaexec bench``
TIME_TO = (1, 100, 1000)
# the longest a worker of the tiered default steps on, waiting for its switch, before its
# timed windows (the windows then time the straight-line steps, and it says so)
SETTLE_S = 300.0


def places_settled(pe):
    """Whether every runner of ``pe`` runs its places the way the places rule keeps
    (``ThreadingProbes.settled``: after the probe that follows a tier's warm-up probe)."""
    runners = getattr(getattr(pe, "_runners", None), "_runners", {})
    probes = getattr(pe, "_probes", None)
    if probes is None:
        return True
    return all(probes.settled(r, pe.exec_strategy.num_threads) for r in runners.values())


def tier_report(pe, step_seconds=None):
    """What the tiered runners of ``pe`` did, or None where none is tiered.

    Keys: ``phases`` (background seconds by phase: trace, worker, load), ``deferred`` (the
    steps a cold compile waited for a free core: ``runtime.tiered.compile_beside``), and
    once a runner
    switched ``switch_step`` (the steps run before it), ``compile_s`` (the background
    compile's seconds), ``before_ms`` / ``after_ms`` (median step time before and after:
    from ``step_seconds``, every step's seconds, when given, else the runner's own count).
    """
    runners = getattr(getattr(pe, "_runners", None), "_runners", {})
    lowerings = [getattr(r, "lowering", None) for r in runners.values()]
    lowerings = [low for low in lowerings if hasattr(low, "switches")]
    if not lowerings:
        return None
    out = {"phases": {k: sum(low.times[k] for low in lowerings)
                      for k in ("trace", "worker", "load")},
           # straight-line steps a cold compile waited for a free core (tiered.compile_beside)
           "deferred": max(low.deferred for low in lowerings)}
    switched = [low for low in lowerings if low.switches]
    if switched:
        low = switched[0]
        at, compile_s = low.switches[0]
        if step_seconds is not None:
            before, after = step_seconds[:at], step_seconds[at:]
        else:
            before, after = list(low.before), list(low.after)
        out.update(switch_step=at, compile_s=compile_s,
                   before_ms=1e3 * statistics.median(before) if before else None,
                   after_ms=1e3 * statistics.median(after) if after else None)
    return out


def to_step(ends, t0, marks=TIME_TO + (10, 10000)):
    """``{"to_step": {N: seconds}, "steps_run": n, "steps_run_s": seconds}`` from the end
    times ``ends`` of the first steps (``perf_counter``) and the start ``t0``."""
    ends = list(ends)
    return {"to_step": {str(n): ends[n - 1] - t0 for n in sorted(set(marks)) if n <= len(ends)},
            "steps_run": len(ends), "steps_run_s": ends[-1] - t0 if ends else 0.0}


def steady_step_s(windows):
    """The steady step time: the median over timed windows of seconds per step."""
    per = [w["seconds"] / len(w["step_seconds"]) for w in windows if w.get("step_seconds")]
    return statistics.median(per) if per else None


def time_to(run, n):
    """``(seconds, estimated)`` to step ``n`` of a harness run, compile included (None
    where the run lacks the figures): measured where its worker ran step ``n`` untimed,
    else its last untimed step plus the steady step time a further step."""
    measured = (run.get("to_step") or {}).get(str(n))
    if measured is not None:
        return measured, False
    steady = run.get("steady_step_s")
    if steady is None or run.get("steps_run_s") is None:
        return None, True
    return run["steps_run_s"] + (n - run.get("steps_run", 0)) * steady, True
