"""The outcome of a replayed step: ``Activity`` intervals and the ``SimResult``.

Every interval the replay books is an ``Activity`` that remembers the activity
whose end let it start; walking back from the last one gives the critical path
(``SimResult.critical``), whose time split by category says what bounds the step.
"""

__all__ = ["Activity", "SimResult"]


class Activity:
    """An interval on a resource: ``cat`` is device, host, comm, wait, hop or step."""

    __slots__ = ("start", "end", "cat", "label", "prev")

    def __init__(self, start, end, cat, label, prev):
        self.start, self.end, self.cat, self.label, self.prev = start, end, cat, label, prev

    def __repr__(self):
        return f"<{self.cat} {self.label} {self.start * 1e6:.1f}-{self.end * 1e6:.1f}us>"


class SimResult:
    """What one replayed step took (seconds) and what bounded it."""

    __slots__ = ("step_s", "places", "processes", "ranks", "inline", "threads",
                 "gil_busy_s", "device_busy_s", "comm_busy_s", "critical", "algorithms",
                 "notes", "activities")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))

    def critical_summary(self):
        """Seconds of the critical path per category."""
        out = {}
        for a in self.critical:
            out[a.cat] = out.get(a.cat, 0.0) + (a.end - a.start)
        return out

    def critical_top(self, n=6):
        """The ``n`` labels holding the most critical-path time: [(label, cat, s, count)]."""
        agg = {}
        for a in self.critical:
            key = (_family(a.label), a.cat)
            s, c = agg.get(key, (0.0, 0))
            agg[key] = (s + a.end - a.start, c + 1)
        top = sorted(agg.items(), key=lambda kv: -kv[1][0])[:n]
        return [(lab, cat, s, c) for (lab, cat), (s, c) in top]


def _family(label):
    # "conv2d_grad#57@cuda:3" -> "conv2d_grad"; "all_reduce(x@GRAD)" -> "all_reduce"
    for sep in ("#", "("):
        label = label.split(sep, 1)[0]
    return label
