"""Every ``ShapeRule`` gives exactly what the meta probe gives (issue 46).

A rule stands in for running the kernel on meta tensors twice (``probe_outputs``),
so validation of a file of many distinct slow ops stays fast. It must not weaken
(or strengthen) validation: for each op with a rule, over shapes with and without
-1 (batch) dims, every dtype, 0-dim inputs and the attrs that matter, the rule and
the probe either both raise or give the same (shape, dtype) per output. The probe
is the oracle: nothing here restates what the kernel does.
"""

import itertools

import pytest

from ssaexec.core.dtypes import DTYPES
from ssaexec.ops.registry import get_op_def, infer_outputs, registered_ops
from ssaexec.program.desc import OpDesc

DT = list(DTYPES)
F32 = "float32"
SHAPES = [[], [1], [3], [-1], [-1, 4], [4, -1], [2, -1, 3], [0, 5], [-1, 1, 3], [2, 3, 4]]

RULED = [t for t in registered_ops() if get_op_def(t).rule is not None]


def _outcome(op_type, ins, attrs, rule):
    op_def = get_op_def(op_type)
    op = OpDesc(op_type, {s: [f"{s}{i}" for i in range(len(v))] for s, v in ins.items()},
                {s.name: ["o"] for s in op_def.outputs}, attrs)
    try:
        res = infer_outputs(op_def, op, ins, rule=rule)
    except Exception as e:  # noqa: BLE001 - any failure is a refusal in validation
        return ("raises", type(e).__name__)
    return {k: [None if s is None else (list(s[0]), s[1]) for s in v] for k, v in res.items()}


def _check(op_type, cases):
    """Compare rule and probe on ``cases`` [(ins, attrs)]; the number that raised."""
    raised = 0
    for ins, attrs in cases:
        want = _outcome(op_type, ins, attrs, rule=False)
        got = _outcome(op_type, ins, attrs, rule=True)
        if isinstance(want, tuple):
            raised += 1
            assert isinstance(got, tuple), (op_type, ins, attrs, want, got)
        else:
            assert got == want, (op_type, ins, attrs, want, got)
    return raised


def _x_cases(attr_sets, slot="X"):
    cases = [({slot: [(sh, F32)]}, a) for sh in SHAPES for a in attr_sets[:6]]
    cases += [({slot: [([-1, 3], dt)]}, a) for dt in DT for a in attr_sets]
    cases += [({slot: [([], dt)]}, a) for dt in DT for a in attr_sets[:6]]
    if len(attr_sets) > 6:  # the rest on every shape too, one dtype
        cases += [({slot: [(sh, F32)]}, a) for sh in SHAPES[:3] for a in attr_sets[6:]]
    return cases


def _ints(*values):
    # numbers of every class a dtype run tells apart: 0, small, int64/uint64 edges, beyond
    return list(values) + [0, 3, -2 ** 63, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64,
                           -2 ** 63 - 1, 10 ** 30]


ATTRS = {
    "gelu": [{"approximate": False}, {"approximate": True}],
    "log_softmax": [{"axis": a} for a in (-4, -3, -2, -1, 0, 1, 2, 3)],
    "softmax": [{"axis": a} for a in (-4, -3, -2, -1, 0, 1, 2, 3, 2 ** 63, 2 ** 64)],
    "scale": [{"scale": s, "bias": b, "bias_after_scale": after}
              for s in _ints(2.5, float("inf"), float("nan"), -1e300)
              for b in (0.0, 1, 2 ** 64) for after in (True, False)],
    "dropout": [{"dropout_prob": p, "is_test": t, "seed": s}
                for p in (0.0, 0, 0.5, 1.0, 2) for t in (False, True) for s in (0, 7)],
}


def _bn_cases():
    modes = [{"is_test": t, "use_global_stats": g, "epsilon": e, "momentum": m}
             for t, g, e, m in ((False, False, 1e-5, 0.9), (True, False, 3, 10 ** 30),
                                (False, True, 0.5, 2 ** 64))]
    xs = [[-1, 3], [2, 3, 4], [-1, 3, 2, 2], [3], [], [2, -1], [-1, -1, 2], [0, 3]]
    stats = [[3], [4], [-1], [1], [], [3, 1]]
    cases = [(_bn(x, st, F32, F32), m) for x in xs for st in stats for m in modes]
    cases += [(_bn([-1, 3, 2], [3], dx, ds), modes[k % 3])
              for k, (dx, ds) in enumerate(itertools.product(DT, DT))]
    return cases


def _bn(x, stats, dx, ds):
    return dict({"X": [(x, dx)]}, **{s: [(stats, ds)] for s in ("Scale", "Bias", "Mean",
                                                                  "Variance")})


def _ln_cases():
    xs = [[-1, 4], [2, 3, 4], [-1, 3, 4], [4], [], [0, 3], [2, -1]]
    params = [None, [4], [12], [3, 4], [-1], [1], [0]]
    cases = []
    for x, p, b in itertools.product(xs, params, (-1, 0, 1, 2, 5)):
        ins = {"X": [(x, F32)]}
        if p is not None:
            ins["Scale"] = [(p, F32)]
            ins["Bias"] = [(p, F32)]
        cases.append((ins, {"begin_norm_axis": b, "epsilon": 1e-5 if b else 3}))
    cases += [({"X": [([-1, 4], dx)], "Scale": [([4], ds)]}, {})
              for dx, ds in itertools.product(DT, DT)]
    cases += [({"X": [([-1, 4], dx)]}, {"epsilon": e}) for dx in DT for e in (0, 10 ** 30)]
    return cases


def _ce_cases(slot, axes):
    xs = [[-1, 5], [2, 3, 5], [-1, 1], [5], [], [0, 5], [3, -1], [-1, 4, 5]]
    labels = [[-1, 1], [-1], [2, 3, 1], [2, 1], [-1, 4, 1], [-1, 5], [1], [], [8, 1], [0, 1]]
    cases = [({slot: [(x, F32)], "Label": [(lab, dt)]},
              {"soft_label": soft, "ignore_index": ig, **ax})
             for x, lab in itertools.product(xs, labels) for soft, dt in ((False, "int64"),
                                                                          (True, F32))
             for ig in (-100,) for ax in axes]
    cases += [({slot: [([-1, 5], dx)], "Label": [([-1, 1], dl)]}, {"soft_label": soft})
              for dx, dl in itertools.product(DT, DT) for soft in (False, True)]
    cases += [({slot: [([-1, 5], F32)], "Label": [([-1, 1], "int64")]}, {"ignore_index": ig})
              for ig in _ints()]
    return cases


def _sum_cases():
    shapes = [[-1, 3], [3], [], [1, 3], [-1, 1], [2, 3], [0, 3]]
    cases = [({"X": [(a, F32), (b, F32), (c, F32)][:n]}, {})
             for a, b, c in itertools.product(shapes, repeat=3) for n in (1, 2, 3)]
    cases += [({"X": [([-1, 3], a), ([3], b), ([], c), ([-1, 3], a)]}, {})
              for a, b, c in itertools.product(DT, DT, ("bool", "int64", F32, "float16"))]
    return cases


def _matmul_cases():
    shapes = [[3], [4], [2, 3], [3, 4], [-1, 3], [3, -1], [2, 3, 4], [-1, 4, 3], [1, 3, 4],
              [], [0, 3], [2, 1, 3, 4]]
    flags = [{"transpose_X": tx, "transpose_Y": ty, "alpha": al}
             for tx, ty, al in ((False, False, 1.0), (True, False, 2), (False, True, 1),
                                (True, True, 0.5))]
    cases = [({"X": [(a, F32)], "Y": [(b, F32)]}, f)
             for a, b in itertools.product(shapes, shapes) for f in flags]
    cases += [({"X": [(a, da)], "Y": [(b, db)]}, {"alpha": al})
              for a, b in (([2, 3], [3, 4]), ([3], [3])) for da, db in itertools.product(DT, DT)
              for al in (1.0, 2, 2 ** 64)]
    return cases


def _reduce_cases():
    attrs = [{"dim": d, "keep_dim": k, "reduce_all": r}
             for d in ([0], [1], [-1], [0, 1], [0, 0], [0, -2], [], [3], [-3])
             for k in (False, True) for r in (False, True)]
    return _x_cases(attrs)


def _concat_cases():
    shapes = [[-1, 3], [2, 3], [0], [], [3], [-1, 4], [2, 3, 1], [0, 3], [-1, -1]]
    cases = [({"X": [(a, F32), (b, F32), (c, F32)][:n]}, {"axis": ax})
             for a, b, c in itertools.product(shapes, repeat=3) for n in (1, 2, 3)
             for ax in (0, 1, -1)][::11]
    cases += [({"X": [([-1, 3], a), ([0], b), ([2, 3], c)]}, {"axis": 0})
              for a, b, c in itertools.product(DT, DT, ("bool", "int8", "uint8", F32))]
    cases += [({"X": [([-1, 3], F32)]}, {"axis": ax}) for ax in (2, -3, 2 ** 63)]
    return cases


def _optim_cases(op_type, attr_sets):
    """Optimizer updates (in place): every state slot of Param's shape or of another,
    LearningRate and SkipUpdate 0-dim or not, each dtype in each slot."""
    slots = [s.name for s in get_op_def(op_type).inputs if s.name != "SkipUpdate"]
    params = [[-1, 3], [2, 3], [3], [], [0, 3], [-1, 1]]
    others = [None, [1], [], [3], [-1, 3], [2, 1, 3], [4]]
    cases = []
    for p, other, at in itertools.product(params, others, attr_sets):
        for k, slot in enumerate(slots):  # one slot at a time differs from Param
            if other is None and k:
                break
            ins = {s: [(p if other is None or s != slot else other, F32)] for s in slots}
            ins["LearningRate"] = [([1] if other is None else ins["LearningRate"][0][0], F32)]
            cases.append((ins, at))
    for skip in ([], [1], [2, 1], [-1, 1]):
        cases += [(dict({s: [([-1, 3], F32)] for s in slots}, SkipUpdate=[(skip, dt)]), {})
                  for dt in ("bool", F32)]
    for slot, dt in itertools.product(slots, DT):
        ins = {s: [([], F32) if s in ("LearningRate", "Beta1Pow", "Beta2Pow") else
                   ([-1, 3], F32)] for s in slots}
        ins[slot] = [(ins[slot][0][0], dt)]
        cases.append((ins, attr_sets[0]))
    # number attrs of each class (the dtype run keys on a stand-in), on int and half state
    names = [k for k, (kind, _) in get_op_def(op_type).attrs.items() if kind == "float"]
    for name, v, dt in itertools.product(names, _ints(1, 2.5, 0.0, -1e300), ("int64", "float16")):
        ins = {s: [([], F32) if s in ("LearningRate", "Beta1Pow", "Beta2Pow") else
                   ([-1, 3], dt)] for s in slots}
        cases += [(ins, dict(at, **{name: v})) for at in attr_sets]
    return cases


SPECIAL = {"batch_norm": _bn_cases, "sum": _sum_cases, "concat": _concat_cases, "matmul": _matmul_cases,
           "reduce_sum": _reduce_cases, "reduce_mean": _reduce_cases,
           "reduce_max": _reduce_cases, "layer_norm": _ln_cases,
           "cross_entropy": lambda: _ce_cases("X", [{}]),
           "softmax_with_cross_entropy": lambda: _ce_cases(
               "Logits", [{"axis": a} for a in (-1, 1, -3)]),
           "sgd": lambda: _optim_cases("sgd", [{}, {"weight_decay": 0.1}]),
           "momentum": lambda: _optim_cases(
               "momentum", [{"weight_decay": w, "use_nesterov": n}
                            for w, n in ((0.0, False), (0.1, False), (0.0, True), (0.1, True))]),
           "adam": lambda: _optim_cases(
               "adam", [{"weight_decay": w, "decoupled": d}
                        for w, d in ((0.0, False), (0.1, False), (0.1, True), (0.0, True))])}


def _cases(op_type):
    if op_type in SPECIAL:
        return SPECIAL[op_type]()
    op_def = get_op_def(op_type)
    names = [s.name for s in op_def.inputs]
    if names == ["X", "Y"]:  # broadcasting binary ops
        attr_sets = [{"axis": a} for a in (-1, 0, 1, 2, 3)] if "axis" in op_def.attrs else [{}]
        cases = [({"X": [(a, F32)], "Y": [(b, F32)]}, at)
                 for a, b in itertools.product(SHAPES, SHAPES) for at in attr_sets]
        cases += [({"X": [(a, da)], "Y": [(b, db)]}, {})
                  for a, b in (([2, 3], [3]), ([2, 3], []), ([], [3]), ([-1, 3], [1]))
                  for da, db in itertools.product(DT, DT)]
        return cases
    if names == ["X"]:
        return _x_cases(ATTRS.get(op_type, [{}]))
    raise AssertionError(f"no cases for {op_type}: add them here")


@pytest.mark.parametrize("op_type", RULED)
def test_the_rule_gives_what_the_probe_gives(op_type):
    cases = _cases(op_type)
    raised = _check(op_type, cases)
    # the cases reach both sides: some inputs are refused, most are not
    assert len(cases) > 20 and raised < len(cases)


def test_the_slow_ops_have_rules():
    # their meta kernels run torch's Python decompositions (0.3-2 ms a run, issue 46)
    for t in ("gelu", "relu", "softmax", "fill_zeros_like", "log_softmax", "scale", "square",
              "elementwise_add", "elementwise_pow", "square_error_cost", "mean", "dropout",
              "batch_norm",
              "layer_norm", "cross_entropy", "softmax_with_cross_entropy", "sum", "matmul",
              "reduce_mean", "reduce_sum", "reduce_max", "sgd", "momentum", "adam"):
        assert get_op_def(t).rule is not None, t
