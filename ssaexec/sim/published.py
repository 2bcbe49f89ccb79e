"""The simulator against published results: the rows of docs/data/published.json.

Each row names a public measurement (source, hardware preset, model, precision,
batch per GPU, gradient accumulation, input pipeline, GPUs) and its figure: a
throughput summed over all GPUs, or a scaling efficiency against a baseline number
of GPUs. ``validate`` predicts every row from those fields alone, by the path
``ssaexec simulate`` takes (a roofline profile of the model on the preset's GPU, a
replayed step of one process per GPU with 25 MiB gradient buckets, the input
pipeline's stall and the slowest rank's jitter), and reports the error.

Policy:

* ``"use": "calibration"`` rows set one efficiency share each
  (``bench/calibrate_sim.py`` -> ``ssaexec.sim.efficiency.CALIBRATED``) and are
  predicted exactly by construction; the table shows them, marked, and the bound is
  judged on the ``validation`` rows;
* nothing in a row's prediction reads its published figure;
* a malformed row is a ``SSAExecError`` naming the row and the field.
"""

import json

from ..core.errors import SSAExecError
from ..core.strategy import BuildStrategy
from .cluster import get_cluster
from .input_pipeline import get_pipeline
from .predict import predict
from .profile import PRECISIONS, Profile

__all__ = ["MODELS", "BOUND", "Cache", "load", "build_model", "predict_row", "validate", "summary",
           "format_table"]

BOUND = 0.15  # relative error allowed on every validation row (issue 34)
BUCKET_MB = 25.0  # DDP's default bucket, and the executor's across processes

# model name -> builder of its training program (fp32; the precision is the estimate's)
MODELS = ("resnet50", "resnet101", "bert-large")
_REQUIRED = {"id": str, "source": str, "model": str, "cluster": str, "precision": str,
             "gpus": int, "batch": int, "metric": str, "published": (int, float),
             "use": str}


def build_model(name, seq_len=128):
    """The training program of a published row's model (momentum SGD for the CNNs,
    Adam standing in for BERT's LAMB: both update every parameter with a few
    memory-bound passes)."""
    from ..program.example_models import build_bert, build_resnet, make_optimizer
    if name in ("resnet50", "resnet101"):
        return build_resnet(int(name[6:]), 224, 1000,
                            optimizer=make_optimizer("momentum", 0.1))[0]
    if name == "bert-large":
        masked = {128: 20, 512: 80}.get(seq_len, max(1, seq_len * 15 // 100))
        return build_bert(seq_len=seq_len, masked=masked,
                          optimizer=make_optimizer("adam", 1e-4))[0]
    raise SSAExecError(f"unknown model {name!r}: use one of {', '.join(MODELS)}")


def load(path):
    """The published table at ``path``, checked row by row."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise SSAExecError(f"{path}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise SSAExecError(f"{path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise SSAExecError(f"{path}: expected an object with a 'rows' list")
    sources = doc.get("sources", {})
    seen = set()
    for i, row in enumerate(doc["rows"]):
        where = f"{path}: row {i}"
        if not isinstance(row, dict):
            raise SSAExecError(f"{where}: expected an object")
        where = f"{path}: row {i} ({row.get('id', '?')})"
        for key, kind in _REQUIRED.items():
            if not isinstance(row.get(key), kind) or isinstance(row.get(key), bool):
                raise SSAExecError(f"{where}: field {key!r} missing or not "
                                   f"{getattr(kind, '__name__', 'a number')}")
        if row["id"] in seen:
            raise SSAExecError(f"{where}: duplicate id")
        seen.add(row["id"])
        if row["source"] not in sources:
            raise SSAExecError(f"{where}: source {row['source']!r} is not in 'sources'")
        if row["model"] not in MODELS:
            raise SSAExecError(f"{where}: unknown model {row['model']!r}")
        if row["precision"] not in PRECISIONS:
            raise SSAExecError(f"{where}: precision must be one of {', '.join(PRECISIONS)}")
        if row["metric"] not in ("throughput", "efficiency"):
            raise SSAExecError(f"{where}: metric must be throughput or efficiency")
        if row["use"] not in ("calibration", "validation"):
            raise SSAExecError(f"{where}: use must be calibration or validation")
        if row["gpus"] < 1 or row["batch"] < 1 or row.get("accumulation", 1) < 1 or \
                row["published"] <= 0:
            raise SSAExecError(f"{where}: gpus, batch, accumulation and published must be "
                               "positive")
        if row["metric"] == "efficiency" and not isinstance(row.get("baseline_gpus"), int):
            raise SSAExecError(f"{where}: an efficiency row needs 'baseline_gpus'")
        try:
            get_cluster(row["cluster"])
            get_pipeline(row.get("input"))
        except SSAExecError as e:
            raise SSAExecError(f"{where}: {e}") from None
    return doc


class Cache:
    """Programs, profiles and graphs shared by the rows (one model, many rows)."""

    def __init__(self):
        self.programs, self.profiles, self.graphs = {}, {}, {}

    def program(self, row):
        key = (row["model"], row.get("seq_len", 128))
        if key not in self.programs:
            self.programs[key] = build_model(*key)
        return self.programs[key]

    def profile(self, row, cluster, efficiency=None):
        key = (row["model"], row.get("seq_len", 128), cluster.device, row["precision"],
               row["batch"], repr(efficiency))
        if key not in self.profiles:
            if len(self.profiles) > 64:  # a calibration tries many shares
                self.profiles.clear()
            self.profiles[key] = Profile.estimate(self.program(row), row["batch"],
                                                  cluster.device, row["precision"],
                                                  efficiency)
        return self.profiles[key]


def _predict(row, gpus, cache, efficiency=None):
    cluster = get_cluster(row["cluster"])
    program = cache.program(row)
    profile = cache.profile(row, cluster, efficiency)
    bs = BuildStrategy(fuse_all_reduce_ops=True, fuse_bucket_mb=BUCKET_MB,
                       gradient_accumulation_steps=row.get("accumulation", 1))
    return predict(program, profile, cluster, gpus, "process-per-gpu", bs,
                   cuda_graph=False, cache=cache.graphs, input_pipeline=row.get("input"))


def predict_row(row, cache=None, efficiency=None):
    """Predict one row; returns a dict: ``predicted`` (the row's metric), ``error``
    (predicted / published - 1), ``prediction`` (the ``Prediction`` at the row's
    GPUs) and ``efficiency`` (against one GPU, or the row's baseline)."""
    cache = cache or Cache()
    p = _predict(row, row["gpus"], cache, efficiency)
    base_n = row.get("baseline_gpus", 1)
    base = p if base_n == row["gpus"] else _predict(row, base_n, cache, efficiency)
    eff = (p.images_per_sec / row["gpus"]) / (base.images_per_sec / base_n)
    p.efficiency = eff if base_n == 1 else None
    predicted = p.images_per_sec if row["metric"] == "throughput" else eff
    return {"row": row, "predicted": predicted, "error": predicted / row["published"] - 1,
            "prediction": p, "efficiency": eff}


def validate(doc, ids=None, efficiency=None):
    """``predict_row`` for every row of ``doc`` (or those in ``ids``), in order."""
    cache = Cache()
    rows = [r for r in doc["rows"] if ids is None or r["id"] in ids]
    return [predict_row(r, cache, efficiency) for r in rows]


def summary(results, bound=BOUND):
    """What the acceptance reads: validation rows within ``bound``, the misfits."""
    val = [r for r in results if r["row"]["use"] == "validation"]
    out = [r for r in val if abs(r["error"]) > bound]
    return {"rows": len(results), "validation_rows": len(val), "outside": len(out),
            "outside_ids": [r["row"]["id"] for r in out],
            "max_abs_error": max((abs(r["error"]) for r in val), default=0.0),
            "median_abs_error": _median([abs(r["error"]) for r in val])}


def _median(xs):
    xs = sorted(xs)
    if not xs:
        return 0.0
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def _fmt(x, metric):
    return f"{x:.1%}" if metric == "efficiency" else f"{x:,.0f}"


def _why(p):
    """The largest losses of a prediction, in words (comm, jitter, input)."""
    parts = [f"{k} {v:.1%}" for k, v in p.losses().items() if v >= 0.0005]
    return ", ".join(parts) or "-"


def format_table(results, bound=BOUND):
    """The validation table as Markdown: one row per published figure."""
    lines = ["| row | GPUs | model, precision, batch | published | predicted | error | "
             "efficiency (pred.) | lost to | use |",
             "|---|---:|---|---:|---:|---:|---:|---|---|"]
    for r in results:
        row, p = r["row"], r["prediction"]
        acc = row.get("accumulation", 1)
        what = f"{row['model']}, {row['precision']}, {row['batch']}" + \
            (f" x{acc}" if acc > 1 else "")
        flag = "" if row["use"] == "calibration" or abs(r["error"]) <= bound else " **!**"
        eff = f"{r['efficiency']:.1%}" + \
            (f" vs {row['baseline_gpus']}" if row.get("baseline_gpus", 1) != 1 else "")
        lines.append(f"| {row['id']} | {row['gpus']} | {what} | "
                     f"{_fmt(row['published'], row['metric'])} | "
                     f"{_fmt(r['predicted'], row['metric'])} | {r['error']:+.1%}{flag} | "
                     f"{eff} | {_why(p)} | {row['use']} |")
    s = summary(results, bound)
    lines.append("")
    lines.append(f"{s['validation_rows']} validation rows: {s['outside']} outside "
                 f"{bound:.0%} ({', '.join(s['outside_ids']) or 'none'}); median |error| "
                 f"{s['median_abs_error']:.1%}, max {s['max_abs_error']:.1%}")
    return "\n".join(lines) + "\n"

