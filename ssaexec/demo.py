"""``make demo``: train the example programs data-parallel on the local devices.

Uses every CUDA device, or CPU places (one per core) without a GPU. Each model
trains on a small synthetic data set whose labels follow a fixed random rule,
so the loss really falls; the demo prints per-step loss, a progress bar and
images/sec, then a short benchmark when the harness is available.
"""

import argparse
import sys
import time

import torch

import ssaexec as se
from ssaexec.models import build_cnn, build_mlp, make_optimizer
from ssaexec.progress import Progress
from ssaexec.synthetic import learnable_dataset


def synthetic_dataset(shape, n, classes=10, seed=0):
    """Images and labels where label = argmax of a fixed linear map of the image."""
    return learnable_dataset(shape, n, classes, seed)


def train(name, build, shape, places, steps, batch, out=print):
    """Train one model; return images/sec over the steps after the first."""
    main, startup, loss = build()
    x, y = synthetic_dataset(shape, batch * 8, seed=1)
    out(f"== {name}: {len(main.global_block().ops)} ops, "
        f"{len(main.all_parameters())} parameters, places {[str(p) for p in places]}, "
        f"batch {batch} ({batch // len(places)} per place)")
    losses, t0 = [], None
    with se.ParallelExecutor(places, main, startup, loss, scope=se.Scope()) as pe, \
            Progress(steps, name) as bar:
        for step in range(steps):
            if step == 1:
                t0 = time.perf_counter()  # the first step builds the graph: not timed
            i = (step % 8) * batch
            lv, = pe.run([loss], feed={"img": x[i:i + batch], "label": y[i:i + batch]})
            losses.append(lv.item())
            bar.update(1, loss=losses[-1])
            out(f"  step {step + 1:3d}  loss {losses[-1]:.4f}")
    ips = batch * (steps - 1) / (time.perf_counter() - t0)
    out(f"  {name}: loss {losses[0]:.4f} -> {losses[-1]:.4f}; {ips:,.1f} images/sec")
    return ips


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ssaexec.demo", description=__doc__)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--places", default=None, help="cpu:N, cuda:0,1 or N (default: all local)")
    ap.add_argument("--no-bench", action="store_true", help="skip the short benchmark")
    args = ap.parse_args(argv)
    places = se.parse_places(args.places) if args.places else (se.cuda_places() or
                                                               se.cpu_places())
    kind = "CUDA" if places[0].is_cuda else "CPU"
    print(f"ssaexec {se.__version__} demo on {len(places)} {kind} place(s); "
          f"torch {torch.__version__}")
    n = len(places)
    train("mlp", lambda: build_mlp(optimizer=make_optimizer("momentum", 0.05)), [784],
          places, args.steps, 64 * n)
    train("cnn", lambda: build_cnn(optimizer=make_optimizer("adam", 0.003)), [1, 28, 28],
          places, args.steps, 32 * n)
    if not args.no_bench:
        try:
            from ssaexec import bench
        except ImportError:
            return 0
        print("== short benchmark (make bench runs the full one)")
        return bench.main(["--quick"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
