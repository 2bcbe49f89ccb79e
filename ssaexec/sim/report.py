"""Simulator output: a text table, a JSON document, and a plot of scaling.

``best_per_size`` picks, for every number of GPUs, the fastest configuration;
``format_scaling`` prints that and the layout comparison (one process per GPU or per
node, with and without CUDA graphs) with what bounds each step and why efficiency
falls (exposed communication, interference, jitter, the input pipeline's stall); ``scaling_json`` is
the same as data; ``plot_scaling`` draws images/sec and efficiency against the number
of GPUs (matplotlib, Agg backend; log-scaled GPUs).
"""

__all__ = ["best_per_size", "format_scaling", "format_sweep", "scaling_json", "plot_scaling"]


def _rate(x):
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k"
    return f"{x:.1f}"


def _configs(predictions):
    seen = []
    for p in predictions:
        if p.label not in seen:
            seen.append(p.label)
    return seen


def best_per_size(predictions):
    """{ranks: the fastest Prediction for that many ranks}."""
    best = {}
    for p in predictions:
        b = best.get(p.ranks)
        if b is None or p.images_per_sec > b.images_per_sec:
            best[p.ranks] = p
    return best


def format_scaling(predictions, program="", cluster=None, profile=None):
    """The scaling report as text (see the module docstring)."""
    lines = []
    if program:
        lines.append(f"ssaexec simulate: {program}")
    if cluster is not None:
        lines.append(f"  cluster  {cluster.name}: {cluster.description}")
    unit = "GPU" if cluster is None or cluster.device.is_gpu else "place"
    if profile is not None:
        lines.append(f"  profile  {profile.source}; batch {profile.batch} per {unit}")
    best = best_per_size(predictions)
    lines.append("")
    lines.append(f"{unit.upper() + 's' if unit == 'GPU' else 'places':>6} {'nodes':>5}  "
                 f"{'best configuration':<34} {'step ms':>9} "
                 f"{'images/s':>9} {'eff':>6} {'comm exposed':>12}  bound by")
    for n, p in sorted(best.items()):
        nodes = max(1, -(-n // cluster.gpus_per_node)) if cluster is not None else "-"
        lines.append(f"{n:>6} {nodes:>5}  {p.label:<34} {p.step_s * 1e3:>9.3f} "
                     f"{_rate(p.images_per_sec):>9} {p.efficiency:>6.1%} "
                     f"{p.comm_exposed_s * 1e3:>9.3f} ms  {p.bound_by()}")
    configs = _configs(predictions)
    if len(configs) > 1:
        lines.append("")
        lines.append(f"images/sec by layout (efficiency against one {unit} of the same "
                     "layout):")
        width = max(24, max(len(c) for c in configs) + 2)
        lines.append(f"{unit + 's':>6}  " + "".join(f"{c:>{width}}" for c in configs))
        by = {(p.ranks, p.label): p for p in predictions}
        for n in sorted(best):
            cells = []
            for c in configs:
                p = by.get((n, c))
                mark = "*" if p is best[n] else " "
                cells.append(f"{_rate(p.images_per_sec)} ({p.efficiency:.0%}){mark}"
                             if p else "-")
            lines.append(f"{n:>6}  " + "".join(f"{x:>{width}}" for x in cells))
        lines.append("  * fastest")
    lines.append("")
    lines.append("why efficiency falls (share of each size's step, fastest configuration):")
    lines.append(f"{unit + 's':>6}  {'communication':>13} {'interference':>12} "
                 f"{'jitter':>8} {'input stall':>11}")
    for n, p in sorted(best.items()):
        lo = p.losses()
        lines.append(f"{n:>6}  {lo['communication']:>13.2%} {lo['interference']:>12.2%} "
                     f"{lo['jitter']:>8.2%} {lo['input']:>11.2%}")
    top_n = max(best)
    p = best[top_n]
    if p.breakdown:
        parts = ", ".join(f"{k} {v * 1e3:.3f}" for k, v in p.breakdown.items() if v > 0)
        lines.append("")
        lines.append(f"step at {top_n} {unit}s, ms: {parts}")
    lines.append("")
    lines.append(f"critical path at {top_n} {unit}s ({p.label}), by time on it:")
    total = sum(p.result.critical_summary().values()) or 1.0
    for label, cat, s, count in p.result.critical_top(6):
        lines.append(f"  {label:<28} {cat:<7} {s * 1e3:9.3f} ms {s / total:6.1%}  "
                     f"({count} intervals)")
    notes = []
    for q in predictions:
        for note in q.notes or ():
            if note not in notes:
                notes.append(note)
    for note in notes:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"


def format_sweep(rows, ranks):
    """A ``sweep_bucket_mb`` result as text: one line per bucket size, best marked."""
    best = max(rows, key=lambda r: r[1].images_per_sec)
    lines = [f"fused all-reduce bucket sweep at {ranks} GPUs ({rows[0][1].label}):",
             f"{'bucket MiB':>10} {'step ms':>9} {'images/s':>9} {'comm exposed':>12}  bound by"]
    for mb, p in rows:
        name = "unfused" if mb is None else f"{mb:g}"
        lines.append(f"{name:>10} {p.step_s * 1e3:>9.3f} {_rate(p.images_per_sec):>9} "
                     f"{p.comm_exposed_s * 1e3:>9.3f} ms  {p.bound_by()}"
                     f"{'  <- best' if (mb, p) == best else ''}")
    return "\n".join(lines) + "\n"


def scaling_json(predictions, program="", cluster=None, profile=None, sweeps=None):
    """The report as a JSON-ready dict."""
    best = best_per_size(predictions)
    doc = {"program": str(program),
           "cluster": cluster.to_dict() if cluster is not None else None,
           "profile": None if profile is None else {
               "source": profile.source, "batch_per_gpu": profile.batch,
               "device": profile.device, "ops": len(profile.costs)},
           "predictions": [p.to_dict() for p in predictions],
           "best": {str(n): p.to_dict() for n, p in sorted(best.items())}}
    if sweeps:
        doc["bucket_sweep"] = {str(n): [dict(p.to_dict(), bucket_mb=mb) for mb, p in rows]
                               for n, rows in sweeps.items()}
    return doc


def plot_scaling(predictions, path, title=""):
    """Images/sec and efficiency against GPUs, one line per configuration; returns path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for c in _configs(predictions):
        ps = sorted((p for p in predictions if p.label == c), key=lambda p: p.ranks)
        xs = [p.ranks for p in ps]
        ax1.plot(xs, [p.images_per_sec for p in ps], marker="o", label=c)
        ax2.plot(xs, [p.efficiency * 100 for p in ps], marker="o", label=c)
    ranks = sorted({p.ranks for p in predictions})
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ranks, [str(n) for n in ranks])
        ax.minorticks_off()
        ax.set_xlabel("GPUs")
        ax.grid(True, which="both", alpha=0.3)
    ax1.set_yscale("log")
    ax1.set_ylabel("images/sec (predicted)")
    ax2.set_ylabel("scaling efficiency %")
    ax2.set_ylim(0, 105)
    ax2.legend(fontsize=8, loc="lower left")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
