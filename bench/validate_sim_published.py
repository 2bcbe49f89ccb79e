"""The scaling simulator against published results (docs/data/published.json).

Predicts every row of the published table from its model, hardware preset,
precision, batch, accumulation and input pipeline (``ssaexec.sim.published``), and
prints published figure, prediction and error per row, then what the acceptance of
issue 34 reads: validation rows within 15 % (at most one in six outside), the 8-GPU
A100 ResNet-50 efficiency against the published 96.6 %, and no efficiency of 99.5 %
or more at 64 GPUs or more without a published row behind it. Then the scaling of
ResNet-50 on DGX A100 nodes from 1 to 512 GPUs with each loss spelled out.

    make validate-sim-published
    python bench/validate_sim_published.py --markdown --out out/validate_sim_published.json

Exit status 1 when the bound is not met. Runs in about 20 s on 2 cores, no GPU.
"""

import argparse
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ssaexec.sim import published  # noqa: E402

TABLE = ROOT / "docs" / "data" / "published.json"
SCALING_GPUS = (1, 8, 16, 64, 256, 512)


def acceptance(results, bound=published.BOUND):
    """The issue's checks as data: {name: (ok, detail)}."""
    s = published.summary(results, bound)
    by = {r["row"]["id"]: r for r in results}
    out = {"within bound": (s["outside"] * 6 <= s["validation_rows"],
                            f"{s['outside']} of {s['validation_rows']} validation rows "
                            f"outside {bound:.0%}")}
    a100 = by.get("rn50-a100-tf32-8")
    if a100 is not None:
        pub = a100["row"]["published"] / (8 * by["rn50-a100-tf32-1"]["row"]["published"])
        eff = a100["efficiency"]
        out["8-GPU A100 ResNet-50 efficiency"] = (
            abs(eff - pub) <= 0.02, f"predicted {eff:.1%}, published {pub:.1%}")
    high = [r["row"]["id"] for r in results
            if r["row"]["gpus"] >= 64 and r["efficiency"] >= 0.995]
    out["no >= 99.5 % at >= 64 GPUs"] = (not high, ", ".join(high) or "none")
    return out


def scaling_rows(gpus=SCALING_GPUS):
    """ResNet-50 TF32, batch 256, DGX A100 nodes: the issue's example, with losses."""
    row = {"id": "example", "model": "resnet50", "cluster": "dgx-a100", "precision": "tf32",
           "batch": 256, "input": "imagenet-cpu", "metric": "throughput", "published": 1,
           "use": "validation"}
    cache = published.Cache()
    out = []
    for n in gpus:
        r = published.predict_row(dict(row, gpus=n), cache)
        p = r["prediction"]
        out.append({"gpus": n, "images_per_sec": p.images_per_sec,
                    "efficiency": r["efficiency"], "step_ms": p.step_s * 1e3,
                    "losses": p.losses(),
                    "breakdown_ms": {k: v * 1e3 for k, v in p.breakdown.items()}})
    return out


def format_scaling(rows):
    lines = ["| GPUs | images/s | efficiency | step ms | communication | interference | "
             "jitter | input stall |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lo = r["losses"]
        lines.append(f"| {r['gpus']} | {r['images_per_sec']:,.0f} | {r['efficiency']:.1%} | "
                     f"{r['step_ms']:.1f} | {lo['communication']:.2%} | "
                     f"{lo['interference']:.2%} | {lo['jitter']:.2%} | {lo['input']:.2%} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", default=str(TABLE), help="the published table (JSON)")
    ap.add_argument("--out", default=str(ROOT / "out" / "validate_sim_published.json"),
                    help="where to write the results as JSON")
    ap.add_argument("--markdown", action="store_true", help="(the tables are Markdown)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    doc = published.load(args.table)
    print(f"predicting {len(doc['rows'])} published rows ...", flush=True)
    results = published.validate(doc)
    print(published.format_table(results))
    checks = acceptance(results)
    for name, (ok, detail) in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    print("\nResNet-50, TF32, batch 256 per GPU, DGX A100 nodes (dgx-a100), one process "
          "per GPU:")
    scaling = scaling_rows()
    print(format_scaling(scaling))
    print(f"{time.perf_counter() - t0:.1f} s")
    doc_out = {"table": args.table, "summary": published.summary(results),
               "acceptance": {k: {"ok": ok, "detail": d} for k, (ok, d) in checks.items()},
               "rows": [{"id": r["row"]["id"], "use": r["row"]["use"],
                         "metric": r["row"]["metric"], "gpus": r["row"]["gpus"],
                         "published": r["row"]["published"], "predicted": r["predicted"],
                         "error": r["error"], "efficiency": r["efficiency"],
                         "prediction": r["prediction"].to_dict()} for r in results],
               "scaling_dgx_a100_resnet50": scaling}
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc_out, indent=1), encoding="utf-8")
    print(f"wrote {out}")
    return 0 if all(ok for ok, _ in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
