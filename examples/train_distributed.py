"""Train an MLP data-parallel over several processes: ssaexec on torch.distributed.

One machine, 2 processes (each with its own CPU places, or one GPU each)::

    torchrun --standalone --nproc-per-node 2 examples/train_distributed.py --steps 5

Several machines: the same script under ``torchrun --nnodes N`` (see
``docs/distributed.md``). Without torchrun it runs as one process.

Every process builds the same program, reads its own shard of the same
synthetic dataset (``se.distributed.shard``) and runs a ``ParallelExecutor``
over its local places; the gradients are summed over places and processes.
Rank 0 prints the loss averaged over all processes, which is the loss one
process would get training on the whole global batch.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ssaexec as se  # noqa: E402
from ssaexec import distributed as dist  # noqa: E402
from ssaexec.models import build_mlp, make_optimizer  # noqa: E402

IN_DIM, HIDDEN, CLASSES = 32, (64, 32), 10


def synthetic_dataset(n, dtype="float32", seed=0):
    """``n`` samples of a learnable task (the label depends on the input); same on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, IN_DIM, generator=g, dtype=getattr(torch, dtype))
    w = torch.randn(IN_DIM, CLASSES, generator=g, dtype=x.dtype)
    label = (x @ w).argmax(dim=1, keepdim=True)
    return {"img": x, "label": label}


def train(steps=5, batch_size=64, places=None, dtype="float32", lr=0.05, seed=0, log=print):
    """Train ``steps`` steps of ``batch_size`` samples (global, over all processes).

    Returns the losses averaged over processes, one per step.
    """
    world, rank = dist.world_size(), dist.rank()
    if batch_size % world:
        raise SystemExit(f"--batch-size {batch_size} must be a multiple of the {world} processes")
    per_rank = batch_size // world
    main, startup, loss = build_mlp(dtype, make_optimizer("momentum", lr), seed=seed,
                                    in_dim=IN_DIM, hidden=HIDDEN, classes=CLASSES)
    data = dist.shard(synthetic_dataset(steps * batch_size, dtype, seed))  # this rank's samples
    places = places or dist.local_places()
    losses = []
    # A process group of several processes makes the executor distributed by itself
    # (BuildStrategy's num_trainers and trainer_id come from it).
    with se.ParallelExecutor(places, main, startup, loss, scope=se.Scope()) as pe:
        for step in range(steps):
            feed = {k: v[step * per_rank:(step + 1) * per_rank] for k, v in data.items()}
            local_loss, = pe.run([loss], feed=feed)
            global_loss = float(dist.average(local_loss))  # a collective: every rank calls it
            losses.append(global_loss)
            if rank == 0:
                log(f"step {step} loss {global_loss:.9g}")
    if rank == 0:
        log(f"trained {steps} steps on {world} process(es) x {len(places)} place(s)")
    return losses


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64, help="global, over all processes")
    ap.add_argument("--places", type=int, default=None,
                    help="places per process (default: the cores shared among processes)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--backend", default=None, help="gloo or nccl (default: by place kind)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds a collective may wait")
    args = ap.parse_args(argv)
    info = dist.init(backend=args.backend, timeout=args.timeout)
    places = dist.local_places(args.places)
    if info.rank == 0:
        print(f"{info.world_size} process(es), backend {info.backend}, places per process: "
              f"{', '.join(str(p) for p in places)}", flush=True)
    train(args.steps, args.batch_size, places, args.dtype, log=lambda s: print(s, flush=True))
    dist.shutdown()


if __name__ == "__main__":
    main()
