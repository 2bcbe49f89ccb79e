"""Calibrate the roofline estimate's efficiency shares on published one-GPU results.

For every row of docs/data/published.json marked ``"use": "calibration"``:

* a one-GPU throughput row sets the share of its model's dominant op class (``conv``
  for the ResNets, ``matmul`` for BERT) on its precision's math unit (``fp32``,
  ``tf32``, ``fp16``): the share whose prediction equals the published figure
  (bisection; the prediction grows with the share);
* a several-GPU efficiency row sets the interference share (compute slowed by the
  collectives beside it), once the compute shares are set.

The ResNets hold one matrix product and BERT no convolution, so two passes settle
both classes. The shares are written into ``ssaexec/sim/efficiency.py``
(``CALIBRATED``) with the row each came from; ``--check`` only reports whether the
committed values are what the table gives (a test runs it).

    python bench/calibrate_sim.py            # fit and write
    python bench/calibrate_sim.py --check    # fit and compare, exit 1 if they differ
"""

import argparse
import pathlib
import pprint
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ssaexec.sim import efficiency, published  # noqa: E402

TABLE = ROOT / "docs" / "data" / "published.json"
TARGET = ROOT / "ssaexec" / "sim" / "efficiency.py"
UNIT = {"fp32": "fp32", "tf32": "tf32", "amp": "fp16"}
CLASS = {"resnet50": "conv", "resnet101": "conv", "bert-large": "matmul"}


def _bisect(f, target, lo, hi, rounds=24):
    """x in [lo, hi] with f(x) == target, f increasing."""
    for _ in range(rounds):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fit(doc):
    """The calibrated table: {class: {unit: entry}} plus {"interference": {"gpu": entry}}."""
    rows = [r for r in doc["rows"] if r["use"] == "calibration"]
    shares = [r for r in rows if r["gpus"] == 1 and r["metric"] == "throughput"]
    overlap = [r for r in rows if r not in shares]
    found = {}
    cache = published.Cache()  # programs and graphs built once
    saved = dict(efficiency.CALIBRATED)
    efficiency.CALIBRATED.clear()  # fit from the priors, never from the committed values
    try:
        for _ in range(2):
            for r in shares:
                cls, unit = CLASS[r["model"]], UNIT[r["precision"]]

                def rate(x, r=r, cls=cls, unit=unit):
                    over = {c: dict(u) for c, u in found.items()}
                    over.setdefault(cls, {})[unit] = x
                    return published.predict_row(r, cache, efficiency=over)["predicted"]
                share = _bisect(rate, r["published"], 0.01, 1.0)
                found.setdefault(cls, {})[unit] = share
        table = {cls: {unit: {"share": round(x, 4), "row": _row_id(rows, cls, unit)}
                       for unit, x in units.items()} for cls, units in found.items()}
        efficiency.CALIBRATED.update(table)
        for r in overlap:
            def eff(c, r=r):
                efficiency.CALIBRATED["interference"] = {"gpu": {"share": c, "row": r["id"]}}
                return -published.predict_row(r, cache)["predicted"]  # falls as c grows
            c = _bisect(eff, -r["published"], 0.0, 0.5)
            table["interference"] = {"gpu": {"share": round(c, 4), "row": r["id"]}}
        return table
    finally:
        efficiency.CALIBRATED.clear()
        efficiency.CALIBRATED.update(saved)


def _row_id(rows, cls, unit):
    for r in rows:
        if r["gpus"] == 1 and CLASS[r["model"]] == cls and UNIT[r["precision"]] == unit:
            return r["id"]
    return None


def write(table):
    text = TARGET.read_text(encoding="utf-8")
    body = pprint.pformat(table, width=88, sort_dicts=True)
    new = re.sub(r"CALIBRATED = \{.*?\n\}\n", "CALIBRATED = " + body[:-1] + "\n}\n", text,
                 count=1, flags=re.S)
    TARGET.write_text(new, encoding="utf-8")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", default=str(TABLE))
    ap.add_argument("--check", action="store_true",
                    help="compare with the committed shares instead of writing them")
    args = ap.parse_args(argv)
    doc = published.load(args.table)
    table = fit(doc)
    for cls, units in table.items():
        for unit, e in units.items():
            print(f"{cls:<13} {unit:<5} {e['share']:.4f}  from {e['row']}")
    if args.check:
        same = all(abs(efficiency.CALIBRATED.get(c, {}).get(u, {}).get("share", -1) -
                       e["share"]) < 5e-4 for c, units in table.items()
                   for u, e in units.items())
        print("committed shares match the table" if same else
              "committed shares differ: rerun python bench/calibrate_sim.py")
        return 0 if same else 1
    write(table)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
