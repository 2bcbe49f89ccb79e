"""Validation time of each op type's worst program file under 1 MB (issue 46).

Validation infers every op's output shapes (``ssaexec.ops.registry.infer_outputs``),
cached per distinct (type, attrs, input specs): a file of many *distinct* ops of one
slow type defeats the cache. For every registered op type this script writes such
files in their densest forms and times loading plus validating them:

* forms: the text form (``.ssa``, written without optional spaces) and compact JSON;
* variants: ``shape-1`` gives every op its own input shape with a -1 (batch) dim,
  ``shape`` the same without -1, ``attr`` one shared set of inputs and a numeric
  attribute that differs per op (``epsilon``, ``ignore_index``, ``alpha`` ...);
* every output slot writes one shared var of unknown shape (the densest legal form:
  an output needs no declaration per op).

Each (form, variant) file is first timed at an eighth of the size to find the op
type's worst one (CPU seconds per byte), which is then written just under
``--bytes`` (1,000,000) and timed in full in a fresh process, as the command line
would read it: load (parse) and validate, CPU seconds of that process (this one
holds every file it built, which makes Python's garbage collector slower). Op types
that own a sub-block (control flow, parameter server) have no template; their shape
rules are constant-time (``infer=``) like the grad ops'. The table starts with the
fixed cost, a 1-op file: the first meta kernel run of a process imports torch's
decompositions (about 1 s), whatever the file.

``python bench/validation_worst.py [--types gelu,batch_norm] [--top 15] [--bytes N]
[--quick] [--json out.json]``; ``--quick`` reports the eighth-size estimate scaled up,
without the full-size run.
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ssaexec as se  # noqa: E402
from ssaexec.ops.registry import get_op_def, infer_outputs, registered_ops  # noqa: E402
from ssaexec.program.desc import OpDesc  # noqa: E402
from ssaexec.program.json_write import program_to_dict  # noqa: E402
from ssaexec.program.serialize import from_json  # noqa: E402
from ssaexec.program.text import program_from_text  # noqa: E402

SCHEMA = "ssaexec-validation-worst/1"
F, L = "float32", "int64"
LIMIT = 1_000_000

# --- templates: op type -> make(n, b) -> (inputs {slot: [(shape, dtype)]}, attrs) ------------
# ``n`` (>= 1) is the size that differs per op in the shape variants, ``b`` the batch dim
# (-1, or 2 in the ``shape`` variant). ATTR names the attribute the ``attr`` variant varies
# (inputs then made with n = 2) and how: "int" (k), "float" (k + 0.5).


def _x(n, b):
    return {"X": [([b, n], F)]}, {}


def _unary_with(**attrs):
    return lambda n, b: ({"X": [([b, n], F)]}, dict(attrs))


TEMPLATES = {t: _x for t in ("relu", "sigmoid", "tanh", "exp", "log", "sqrt", "square", "abs",
                             "gelu", "assign", "fill_zeros_like", "mean", "softmax",
                             "log_softmax", "flatten", "argmax", "argmin", "scale", "dropout")}
TEMPLATES.update({
    "cast": _unary_with(out_dtype="float64"),
    "reduce_sum": _unary_with(dim=[1]), "reduce_mean": _unary_with(dim=[1]),
    "reduce_max": _unary_with(dim=[1]),
    "transpose": _unary_with(axis=[1, 0]), "reshape": _unary_with(shape=[-1]),
    "unsqueeze": _unary_with(axes=[0]),
    "squeeze": lambda n, b: ({"X": [([b, n, 1], F)]}, {"axes": [2]}),
    "sum": lambda n, b: ({"X": [([b, n], F)] * 2}, {}),
    "concat": lambda n, b: ({"X": [([b, n], F)] * 2}, {"axis": 1}),
    "split": lambda n, b: ({"X": [([b, 2 * n], F)]}, {"num": 2, "axis": 1}),
    "square_error_cost": lambda n, b: ({"X": [([b, n], F)], "Y": [([b, n], F)]}, {}),
    "matmul": lambda n, b: ({"X": [([b, n], F)], "Y": [([n, 2], F)]}, {}),
    "mul": lambda n, b: ({"X": [([b, n], F)], "Y": [([n, 2], F)]}, {}),
    "conv2d": lambda n, b: ({"Input": [([b, 1, n, 2], F)], "Filter": [([1, 1, 1, 1], F)]}, {}),
    "pool2d": lambda n, b: ({"X": [([b, 1, n + 1, 2], F)]}, {}),
    "batch_norm": lambda n, b: ({"X": [([b, n], F)], **{s: [([n], F)] for s in (
        "Scale", "Bias", "Mean", "Variance")}}, {}),
    "layer_norm": lambda n, b: ({"X": [([b, n], F)]}, {}),
    "lookup_table": lambda n, b: ({"W": [([n, 2], F)], "Ids": [([b, 1], L)]}, {}),
    "cross_entropy": lambda n, b: ({"X": [([b, n], F)], "Label": [([b, 1], L)]}, {}),
    "softmax_with_cross_entropy": lambda n, b: ({"Logits": [([b, n], F)],
                                                 "Label": [([b, 1], L)]}, {}),
    "accuracy": lambda n, b: ({"X": [([b, n], F)], "Label": [([b, 1], L)]}, {}),
    "sgd": lambda n, b: ({"Param": [([n], F)], "Grad": [([n], F)],
                          "LearningRate": [([1], F)]}, {}),
    "momentum": lambda n, b: ({"Param": [([n], F)], "Grad": [([n], F)],
                               "Velocity": [([n], F)], "LearningRate": [([1], F)]}, {}),
    "adam": lambda n, b: ({**{s: [([n], F)] for s in ("Param", "Grad", "Moment1", "Moment2")},
                           **{s: [([1], F)] for s in ("LearningRate", "Beta1Pow",
                                                      "Beta2Pow")}}, {}),
    "amp_unscale": lambda n, b: ({"Grads": [([n], F)], "Scale": [([], F)]}, {}),
    "amp_update_scale": lambda n, b: ({"Scale": [([], F)], "GrowthTracker": [([], "int32")],
                                       "FoundInf": [([], F)], "SkippedSteps": [([], L)]}, {}),
    "lr_schedule": lambda n, b: ({"Step": [([1], L)]}, {}),
    "fill_constant": lambda n, b: ({}, {"shape": [n]}),
    "uniform_random": lambda n, b: ({}, {"shape": [n]}),
    "gaussian_random": lambda n, b: ({}, {"shape": [n]}),
    "assign_value": lambda n, b: ({}, {"shape": [1], "values": [float(n)]}),
    "assign_bytes": lambda n, b: ({}, {"shape": [0], "data": ""}),
    "send": lambda n, b: ({"X": [([n], F)]}, {}),
    "recv": lambda n, b: ({"Token": [([], F)]}, {"shapes": [[n]], "dtypes": [F]}),
})
for _t in ("elementwise_add", "elementwise_sub", "elementwise_mul", "elementwise_div",
           "elementwise_max", "elementwise_min", "elementwise_pow"):
    TEMPLATES[_t] = lambda n, b: ({"X": [([b, n], F)], "Y": [([1], F)]}, {})

# the attribute the ``attr`` variant varies, per op type (its grad op varies it too)
ATTR = {"scale": ("bias", "float"), "dropout": ("seed", "int"), "matmul": ("alpha", "float"),
        "batch_norm": ("epsilon", "float"), "layer_norm": ("epsilon", "float"),
        "cross_entropy": ("ignore_index", "int"),
        "softmax_with_cross_entropy": ("ignore_index", "int"),
        "lookup_table": ("padding_idx", "int"), "conv2d": ("paddings", "pair"),
        "sgd": ("weight_decay", "float"), "momentum": ("mu", "float"),
        "adam": ("beta1", "float"), "amp_update_scale": ("growth_factor", "float"),
        "lr_schedule": ("base_lr", "float"), "fill_constant": ("value", "float"),
        "uniform_random": ("min", "float"), "gaussian_random": ("mean", "float"),
        "assign_value": ("values", "floats"), "accuracy": ("k", "int"),
        "send": ("peer", "int"), "recv": ("peer", "int")}
# attr variant inputs: W must hold every padding_idx
_ATTR_N = {"lookup_table": 300_000}


def template(op_type):
    """``make(n, b)`` for ``op_type`` (a grad op derives its own from its forward's), or None."""
    op_def = get_op_def(op_type)
    if op_def.is_control:
        return None
    if not op_def.is_grad:
        return TEMPLATES.get(op_type)
    fwd = get_op_def(op_def.forward_type)
    make = TEMPLATES.get(fwd.type)
    if make is None:
        return None

    def make_grad(n, b):
        ins, attrs = make(n, b)
        # forward outputs and output gradients: one shared var of unknown shape each
        out = {s.name: [(None, _out_dtype(fwd, s.name))] for s in fwd.outputs}
        gins = {}
        for s in op_def.inputs:
            if s.name in ins:
                gins[s.name] = ins[s.name]
            elif s.name in out:
                gins[s.name] = out[s.name]
            elif s.name.endswith("@GRAD") and s.name[:-5] in out:
                gins[s.name] = out[s.name[:-5]]
        return gins, attrs
    return make_grad


_DTYPES = {}


def _out_dtype(op_def, slot, index=0):
    """The dtype op ``op_def`` gives output ``slot`` on its template (one inference, cached)."""
    key = op_def.type
    if key not in _DTYPES:
        ins, attrs = TEMPLATES[op_def.type](3, 2) if not op_def.is_grad else \
            template(op_def.type)(3, 2)
        op = OpDesc(op_def.type, {s: [f"i{i}" for i in range(len(v))] for s, v in ins.items()},
                    {s.name: ["o"] for s in op_def.outputs}, attrs)
        res = infer_outputs(op_def, op, ins) or {}
        _DTYPES[key] = {s: [sp[1] if sp else F for sp in specs] for s, specs in res.items()}
    got = _DTYPES[key].get(slot)
    if op_def.is_grad and got is None:  # a grad has its forward input's dtype
        return F
    return got[index] if got and index < len(got) else F


# --- writing ---------------------------------------------------------------------------------
def _names():
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    n = 0
    while True:
        k, s = n, ""
        while True:
            s = letters[k % 52] + s
            k = k // 52 - 1
            if k < 0:
                break
        n += 1
        if s not in ("var", "block", "names"):
            yield s


def build(op_type, variant, count):
    """A ``ProgramDesc`` of ``count`` distinct ``op_type`` ops of ``variant``."""
    op_def = get_op_def(op_type)
    make = template(op_type)
    fresh = _names()
    prog = se.Program()
    block = prog.global_block()
    declared = {}  # (shape, dtype) -> var name (inputs); outputs by (slot, dtype)

    def var_for(spec, shared_key=None):
        shape, dtype = spec
        key = shared_key or (None if shape is None else tuple(shape), dtype)
        name = declared.get(key)
        if name is None:
            name = declared[key] = next(fresh)
            block.create_var(name, None if shape is None else list(shape), dtype, is_data=True)
        return name

    outs = {}
    sample, _ = make(1, 2)
    for s in op_def.outputs:
        # split makes two parts; a grad of a duplicable input one per input
        n_out = 2 if op_type == "split" else \
            len(sample.get(s.name[:-5], [0])) if s.duplicable and op_def.is_grad else 1
        names = []
        for i in range(n_out):
            dtype = _out_dtype(op_def, s.name, i) if not op_def.is_grad else \
                _grad_out_dtype(op_def, s.name)
            key = ("out", s.name, i)
            name = declared.get(key)
            if name is None:
                name = declared[key] = next(fresh)
                block.create_var(name, None, dtype)
            names.append(name)
        outs[s.name] = names
    attr_name, attr_kind = ATTR.get(op_def.forward_type or op_type, (None, None))
    for k in range(count):
        if variant == "attr":
            ins, attrs = make(_ATTR_N.get(op_def.forward_type or op_type, 2), 2)
            attrs = dict(attrs)
            attrs[attr_name] = {"int": k, "float": k + 0.5, "pair": [k, 0],
                                "floats": [k + 0.5]}[attr_kind]
            if attr_name == "k":
                attrs[attr_name] = k + 1
        else:
            ins, attrs = make(k + 1, -1 if variant == "shape-1" else 2)
        inputs = {s: [var_for(spec) for spec in specs] for s, specs in ins.items()}
        block.append_op(op_type, inputs, outs, attrs)
    return prog


def _grad_out_dtype(op_def, slot):
    make = template(op_def.type)
    ins, _ = make(3, 2)
    specs = ins.get(slot[:-5])
    return specs[0][1] if specs else F


def _value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if v is None:
        return "null"
    return json.dumps(v)


def to_text(prog):
    """The text form of ``prog`` without optional spaces (what a hostile file would use)."""
    lines = ["ssaexec-program v1 random_seed=0", "block 0 parent=-1 {"]
    block = prog.global_block()
    for v in block.vars.values():
        shape = "" if v.shape is None else "[" + ",".join(str(d) for d in v.shape) + "]"
        lines.append(f"var {v.name}:{v.dtype}{shape}" + (" data" if v.is_data else ""))
    for op in block.ops:
        slots = lambda d: ",".join(f"{s}={n[0]}" if len(n) == 1 else f"{s}=[{','.join(n)}]"
                                   for s, n in d.items())
        outs = op.outputs
        lhs = next(iter(outs.values()))[0] if list(outs) == ["Out"] and \
            len(outs["Out"]) == 1 else "{" + slots(outs) + "}"
        attrs = "{" + ",".join(f"{k}={_value(v)}" for k, v in op.attrs.items()) + "}" \
            if op.attrs else ""
        lines.append(f"{lhs}={op.type}({slots(op.inputs)}){attrs}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_compact_json(prog):
    return json.dumps(program_to_dict(prog), separators=(",", ":"))


WRITERS = {"ssa": to_text, "json": to_compact_json}


def variants(op_type):
    op_def = get_op_def(op_type)
    names = ["shape-1", "shape"]
    if (op_def.forward_type or op_type) in ATTR:
        names.append("attr")
    return names


def measure(text, form):
    """(load s, validate s) in CPU seconds of this process; the ProgramError, if any."""
    gc.collect()
    t0 = time.process_time()
    try:
        prog = from_json(text, "worst.json") if form == "json" else \
            program_from_text(text, "worst.ssa")
    except se.ProgramError as e:
        return time.process_time() - t0, 0.0, e
    t1 = time.process_time()
    try:
        prog.validate()
    except se.ProgramError as e:
        return t1 - t0, time.process_time() - t1, e
    return t1 - t0, time.process_time() - t1, None


_CHILD = """
import json, sys, time
import ssaexec as se
t0 = time.process_time()
try:
    p = se.load_program(sys.argv[1])
    t1 = time.process_time()
    p.validate()
    print(json.dumps({"load_s": t1 - t0, "validate_s": time.process_time() - t1}))
except se.ProgramError as e:
    print(json.dumps({"error": str(e)}))
"""


def measure_fresh(text, form):
    """``measure`` in a fresh Python process reading the file (what ``ssaexec`` would do)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"worst.{form}"
        path.write_text(text)
        out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True,
                             text=True, check=True,
                             env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve()
                                                               .parents[1])))
    return json.loads(out.stdout.strip().splitlines()[-1])


def file_under(op_type, variant, form, limit):
    """(text, ops) of the largest ``variant`` file in ``form`` under ``limit`` bytes."""
    write = WRITERS[form]
    probe = 500
    per_op = (len(write(build(op_type, variant, 2 * probe))) -
              len(write(build(op_type, variant, probe)))) / probe
    count = max(1, int(limit / per_op))
    while True:
        text = write(build(op_type, variant, count))
        if len(text) < limit:
            return text, count
        count = int(count * limit / len(text)) - 1


def worst(op_type, limit, quick):
    """The op type's worst (form, variant) file: a result row."""
    best = None
    for variant in variants(op_type):
        for form in WRITERS:
            text, count = file_under(op_type, variant, form, limit // 8)
            load, valid, err = measure(text, form)
            if err is not None:
                return {"type": op_type, "error": f"{variant}/{form}: {err}"}
            rate = (load + valid) / len(text)
            if best is None or rate > best[0]:
                best = (rate, variant, form, count, load, valid, len(text))
    rate, variant, form, count, load, valid, size = best
    row = {"type": op_type, "variant": variant, "form": form}
    if quick:
        scale = limit / size
        row.update(ops=int(count * scale), bytes=limit, load_s=load * scale,
                   validate_s=valid * scale, estimated=True)
    else:
        text, count = file_under(op_type, variant, form, limit)
        got = measure_fresh(text, form)
        if "error" in got:
            return {"type": op_type, "error": f"{variant}/{form}: {got['error']}"}
        row.update(ops=count, bytes=len(text), load_s=got["load_s"],
                   validate_s=got["validate_s"], estimated=False)
    row["total_s"] = row["load_s"] + row["validate_s"]
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", help="comma-separated op types (default: every registered one)")
    ap.add_argument("--bytes", type=int, default=LIMIT, help="file size bound (default 1e6)")
    ap.add_argument("--top", type=int, default=0, help="print only the N slowest")
    ap.add_argument("--quick", action="store_true",
                    help="scale the eighth-size estimate instead of timing the full file")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    types = args.types.split(",") if args.types else registered_ops()
    rows, skipped = [], []
    for t in types:
        if template(t) is None:
            skipped.append(t)
            continue
        row = worst(t, args.bytes, args.quick)
        rows.append(row)
        print(f"  {t}: " + (row.get("error") or f"{row['total_s']:.2f} s"), file=sys.stderr,
              flush=True)
    rows.sort(key=lambda r: -r.get("total_s", 1e9))
    load = os.getloadavg()[0]
    fixed = measure_fresh(to_text(build("relu", "shape", 1)), "ssa")
    print(f"machine: {os.cpu_count()} cores, load average {load:.2f} at the end; CPU seconds "
          "of a fresh process per file")
    print(f"fixed cost (a 1-op file): load {fixed['load_s']:.2f} s, validate "
          f"{fixed['validate_s']:.2f} s (torch's first meta kernel run loads its "
          "decompositions)")
    print(f"{'op type':34s} {'variant':8s} {'form':5s} {'ops':>7s} {'bytes':>8s} "
          f"{'load s':>7s} {'valid s':>7s} {'total s':>7s}")
    for row in rows[:args.top or None]:
        if "error" in row:
            print(f"{row['type']:34s} ERROR {row['error']}")
            continue
        est = " (estimated)" if row["estimated"] else ""
        print(f"{row['type']:34s} {row['variant']:8s} {row['form']:5s} {row['ops']:7d} "
              f"{row['bytes']:8d} {row['load_s']:7.2f} {row['validate_s']:7.2f} "
              f"{row['total_s']:7.2f}{est}")
    if skipped:
        print(f"no template (own a sub-block): {', '.join(skipped)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"schema": SCHEMA, "rows": rows,
                                               "skipped": skipped}, indent=1))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
