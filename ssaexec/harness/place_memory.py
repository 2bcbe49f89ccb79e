"""Tensor accounting of a ``ParallelExecutor``'s places: bytes per kind, sampled at every op.

What is counted: the tensors bound in each place's scope (``pe.local_scopes[i]``), which
on the readable path is every value the runtime holds between ops (the memory plan erases
a value once its last reader has run), each storage once per place (views and aliases
share a storage; the first kind that claims it, in ``KINDS`` order, counts it). Not
counted: an op's temporaries while it runs and torch's allocator slack, so this is a
lower bound of what the process needs, measured the same way for every stage.

When: after every op handle of the observed steps (``ParallelExecutor.observe``, the
readable per-op path whatever ``ExecutionStrategy`` says), every place at once: an op's
outputs are counted, inputs it was the last reader of are already gone.

Kinds, by name against the plain program (the one the user built):

* ``params``: a parameter, or its shard ``p@SHARD``; under ZeRO stage 3 a sharded
  parameter's full value is ``gathered`` instead (it exists only between its all-gather
  and its free);
* ``grads``: a name with ``@GRAD`` (full or shard);
* ``optimizer``: any other persistable (moments, beta powers, the learning rate) or its
  shard;
* ``gathered``: see ``params``;
* ``activations``: everything else (feeds, forward values kept for backward, temporaries
  between ops).

``model`` = params + grads + optimizer + gathered: the figure ZeRO shrinks (issue 49,
acceptance 2). Invariant: a sample's kinds add up to its ``total``.
"""

import threading

from ..program.shard import SHARD_SUFFIX

__all__ = ["KINDS", "PlaceMemory", "measure_step"]

KINDS = ("params", "optimizer", "grads", "gathered", "activations")
MODEL_KINDS = ("params", "optimizer", "grads", "gathered")


class PlaceMemory:
    """Peaks of the tensor bytes per kind in each place's scope, over the samples taken.

    Parameters
    ----------
    program : Program
        The plain program (its parameters and persistables name the kinds).
    scopes : list of Scope
        One per place (``pe.local_scopes``).
    gathered : iterable of str
        Full parameters that are gathered, not kept (ZeRO stage 3's sharded ones).
    """

    def __init__(self, program, scopes, gathered=()):
        self.scopes = list(scopes)
        self.params = {v.name for v in program.all_parameters()}
        self.persistables = {v.name for v in program.list_vars() if v.persistable}
        self.gathered = set(gathered)
        self._kind = {}
        self._lock = threading.Lock()
        self.samples = 0
        n = len(self.scopes)
        self.peak_total = [0] * n
        self.peak_model = [0] * n
        self.at_model_peak = [dict.fromkeys(KINDS, 0) for _ in range(n)]
        self.peak_kind = [dict.fromkeys(KINDS, 0) for _ in range(n)]

    def kind(self, name):
        """The kind of the value named ``name`` (cached)."""
        k = self._kind.get(name)
        if k is None:
            base = name[:-len(SHARD_SUFFIX)] if name.endswith(SHARD_SUFFIX) else name
            if "@GRAD" in base:
                k = "grads"
            elif base in self.params:
                k = "gathered" if name == base and base in self.gathered else "params"
            elif base in self.persistables:
                k = "optimizer"
            else:
                k = "activations"
            self._kind[name] = k
        return k

    def count(self, scope):
        """``{kind: bytes}`` of the tensors bound in ``scope`` now (each storage once)."""
        import torch
        sizes = dict.fromkeys(KINDS, 0)
        claims = {}
        for name, t in list(scope.vars.items()):  # a copy: other places' threads write
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            part = self.kind(name)  # a memory category (KINDS), not a handle kind
            if key in claims:
                if KINDS.index(part) >= KINDS.index(claims[key][0]):
                    continue
                sizes[claims[key][0]] -= claims[key][1]
            nbytes = storage.nbytes()
            claims[key] = (part, nbytes)
            sizes[part] += nbytes
        return sizes

    def sample(self, *_):
        """Count every place now and keep the peaks (``observe``'s ``on_op`` signature)."""
        counts = [self.count(s) for s in self.scopes]
        with self._lock:
            self.samples += 1
            for i, sizes in enumerate(counts):
                model = sum(sizes[k] for k in MODEL_KINDS)
                total = model + sizes["activations"]
                self.peak_total[i] = max(self.peak_total[i], total)
                if model > self.peak_model[i]:
                    self.peak_model[i] = model
                    self.at_model_peak[i] = sizes
                for k in KINDS:
                    self.peak_kind[i][k] = max(self.peak_kind[i][k], sizes[k])

    def report(self):
        """Per place: ``peak_model``, ``peak_total``, ``at_model_peak`` and ``peak_kind``
        (bytes), and the number of samples."""
        return {"samples": self.samples,
                "places": [{"peak_model": self.peak_model[i], "peak_total": self.peak_total[i],
                            "at_model_peak": dict(self.at_model_peak[i]),
                            "peak_kind": dict(self.peak_kind[i])}
                           for i in range(len(self.scopes))]}


def measure_step(pe, program, fetch_list, feed=None, steps=1):
    """Run ``steps`` observed steps of ``pe`` and return ``PlaceMemory.report()``.

    ``program`` is the plain program ``pe`` was built from. Samples before the first step
    (the state the step starts from) and after every op. Under ZeRO stage 3 the full
    values of the sharded parameters (``pe.shard_layout()``) count as ``gathered``.
    """
    layout = pe.shard_layout()
    gathered = [p.name for p in layout] if layout is not None and layout.stage == 3 else ()
    memory = PlaceMemory(program, pe.local_scopes, gathered)
    memory.sample()
    with pe.observe(fetch_list, memory.sample):
        for _ in range(steps):
            pe.run(fetch_list, feed=feed)
    memory.sample()
    return memory.report()
