"""``make demo``: train a CNN data-parallel on real data, evaluate it, save it, hand it back.

The main part trains a small convolutional network on scikit-learn's bundled 8x8
handwritten digits (``sklearn.datasets.load_digits``: on disk, no download), split
into a training and a held-out test set, on every local place (every GPU, or one CPU
place per core). The network is an ordinary ``torch.nn.Module`` imported with
``se.from_torch``; each epoch prints one line (train loss, held-out accuracy through an
evaluation executor sharing the training values, images/sec). At the end the run is
saved as a checkpoint and written back into the ``nn.Module``, whose own accuracy is
printed next to ssaexec's. A short synthetic-data benchmark follows (``--no-bench``
skips it): ssaexec as users get it (its default compiler, ``DEFAULT_COMPILER``; when that
is the tiered "auto": steps at once, the compile in the background) against torch.compile, eager and DDP, on a launch-bound model
(the small transformer: ``ssaexec bench --preset transformer``) and a kernel-bound one
(the quick ResNet-18: ``--quick``), each with its compile time, the time to 1, 100 and
1000 steps compile included, and a headline against torch.compile and DDP
(``DEMO_BENCH``, ``short_benchmark``).
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import ssaexec as se
from ssaexec.core.progress import Progress

__all__ = ["load_digits_split", "DigitsCNN", "train_digits", "DEMO_BENCH", "short_benchmark",
           "main"]

# the demo's benchmark: (what it shows, ``ssaexec bench`` arguments), each run in turn.
# ssaexec's default compiles in the background while its steps run; the demo waits for its
# switch to the compiled segments at most --settle-s seconds a run (a compile that takes
# longer is said, and the figures are the straight-line steps'), to stay a few minutes:
# 30 s on the transformer (one torch thread: a core is left for the compile), 10 s on the
# ResNet (its steps keep every core busy, so on a small machine the background compile,
# at the lowest priority, waits for them)
DEMO_MODES = "ssaexec,torch-eager,torch-compile,torch-ddp"
DEMO_BENCH = (
    ("a launch-bound model: the small transformer",
     ["--preset", "transformer", "--modes", DEMO_MODES, "--settle-s", "30"]),
    ("a kernel-bound model: ResNet-18 at a quarter of the width",
     ["--quick", "--modes", DEMO_MODES, "--settle-s", "10"]),
)


def load_digits_split(test_fraction=0.2, seed=0):
    """``(x_train, y_train, x_test, y_test)``: images [N, 1, 8, 8] in [0, 1], int64 labels."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise se.SSAExecError("the demo's data set comes with scikit-learn: "
                              "pip install scikit-learn (make demo installs it)") from None
    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(y) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


class DigitsCNN(torch.nn.Module):
    """Two conv-batchnorm-relu-pool stages and a linear classifier, for 8x8 images."""

    def __init__(self, width=16, classes=10):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, width, 3, padding=1), torch.nn.BatchNorm2d(width),
            torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(width, 2 * width, 3, padding=1), torch.nn.BatchNorm2d(2 * width),
            torch.nn.ReLU(), torch.nn.MaxPool2d(2))
        self.classifier = torch.nn.Linear(2 * width * 2 * 2, classes)

    def forward(self, image):
        return self.classifier(self.features(image).flatten(1))


def train_digits(places, epochs=12, batch_per_place=32, lr=0.05, checkpoint=None, seed=0,
                 out=print, progress=True):
    """Train ``DigitsCNN`` on the digits data set; return a dict of what happened.

    Keys: ``module`` (the ``nn.Module`` with the trained values written back),
    ``train_loss`` and ``test_accuracy`` (one per epoch), ``images_per_sec`` (the last
    epoch's), ``torch_accuracy`` (the written-back module's own, in eval mode) and
    ``checkpoint`` (its path, when one was asked for).
    """
    torch.manual_seed(seed)
    x, y, x_test, y_test = load_digits_split(seed=seed)
    module = DigitsCNN()
    batch = batch_per_place * len(places)
    steps_per_epoch = len(y) // batch
    schedule = se.optimizer.lr.CosineAnnealing(lr, T_max=epochs * steps_per_epoch)
    main, startup, loss = se.from_torch(module, {"image": x[:batch], "target": y[:batch]},
                                        loss_fn=F.cross_entropy,
                                        optimizer=se.optimizer.Momentum(schedule, 0.9))
    test_main, _, logits = se.from_torch_eval(module, {"image": x_test[:batch]})
    out(f"== digits: {len(y)} training and {len(y_test)} held-out 8x8 images "
        f"(scikit-learn), a {sum(p.numel() for p in module.parameters()):,}-parameter CNN "
        f"imported with se.from_torch, places {', '.join(map(str, places))}, batch {batch} "
        f"({batch_per_place} per place), {epochs} epochs")
    result = {"train_loss": [], "test_accuracy": []}
    gen = torch.Generator().manual_seed(seed + 1)
    with se.ParallelExecutor(places, main, startup, loss, scope=se.Scope()) as pe, \
            se.ParallelExecutor(places, test_main, share_vars_from=pe) as evaluator, \
            Progress(epochs * steps_per_epoch, "digits", enabled=progress, plain=False) as bar:
        for epoch in range(epochs):
            order = torch.randperm(len(y), generator=gen)
            losses = []
            t0 = time.perf_counter()
            for k in range(steps_per_epoch):
                idx = order[k * batch:(k + 1) * batch]
                value, = pe.run([loss], feed={"image": x[idx], "target": y[idx]})
                losses.append(float(value))
                bar.update(1, f"epoch {epoch + 1} loss {losses[-1]:.3f}")
            ips = steps_per_epoch * batch / (time.perf_counter() - t0)
            pred, = evaluator.run([logits], feed={"image": x_test})
            acc = float((pred.argmax(1) == y_test).float().mean())
            result["train_loss"].append(sum(losses) / len(losses))
            result["test_accuracy"].append(acc)
            result["images_per_sec"] = ips
            bar.clear()
            out(f"  epoch {epoch + 1:2d}/{epochs}  train loss {result['train_loss'][-1]:.4f}  "
                f"held-out accuracy {acc:6.1%}  {ips:8,.0f} images/sec  "
                f"lr {pe.get_lr():.4f}")
        if checkpoint is not None:
            se.save_checkpoint(checkpoint, pe)
            result["checkpoint"] = str(checkpoint)
        se.write_back(pe, module)
    module.eval()
    with torch.no_grad():
        torch_acc = float((module(x_test).argmax(1) == y_test).float().mean())
    result.update(module=module, torch_accuracy=torch_acc)
    return result


def short_benchmark(out_dir, extra=(), progress=True, out=print):
    """Run ``DEMO_BENCH`` (``extra``: arguments added to each run, e.g. smaller models);
    the exit status, 1 if any mode failed."""
    from ssaexec import harness as bench
    rc = 0
    for k, (what, args) in enumerate(DEMO_BENCH):
        out(f"== benchmark {k + 1}/{len(DEMO_BENCH)}: {what}")
        rc |= bench.main(list(args) + ["--out-dir", str(out_dir), "--plot", "none"] +
                         ([] if progress else ["--no-progress"]) + list(extra))
    return rc


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ssaexec.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--places", default=None, help="cpu:N, cuda:0,1 or N (default: all local)")
    ap.add_argument("--checkpoint", default=None,
                    help="where the checkpoint goes (default: out/demo/digits.safetensors)")
    ap.add_argument("--no-bench", action="store_true", help="skip the short benchmark")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    places = se.parse_places(args.places) if args.places else (se.cuda_places() or
                                                               se.cpu_places())
    kind = "CUDA" if places[0].is_cuda else "CPU"
    print(f"ssaexec {se.__version__} demo on {len(places)} {kind} place(s); "
          f"torch {torch.__version__}")
    path = Path(args.checkpoint or "out/demo/digits.safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    res = train_digits(places, epochs=args.epochs, checkpoint=path,
                       progress=not args.no_progress)
    target = 0.95
    acc = res["test_accuracy"][-1]
    print(f"  checkpoint: {path} (se.load_checkpoint resumes it, on any number of places)")
    print(f"  written back into the nn.Module (se.write_back): in eval mode it classifies "
          f"{res['torch_accuracy']:.1%} of the held-out images, ssaexec {acc:.1%} (each place "
          f"used its own BatchNorm statistics; the module got their mean)")
    print(f"  held-out accuracy {acc:.1%}: target >= {target:.0%} "
          + ("met" if acc >= target else "not met (train longer: --epochs)"))
    if args.no_bench:
        return 0 if acc >= target else 1
    print("== short benchmark on synthetic data (make bench runs the full one): ssaexec's "
          "default against torch.compile, eager and DDP")
    with tempfile.TemporaryDirectory() as tmp:
        return short_benchmark(tmp, progress=not args.no_progress)


if __name__ == "__main__":
    sys.exit(main())
