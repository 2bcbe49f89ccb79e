"""Train an MLP data-parallel over several processes: ssaexec on torch.distributed.

One machine, 2 processes (each with its own CPU places, or one GPU each)::

    torchrun --standalone --nproc-per-node 2 examples/train_distributed.py --steps 5

Several machines: the same script under ``torchrun --nnodes N`` (see
``docs/distributed.md``). Without torchrun it runs as one process.

Fault tolerance: with ``--checkpoint-dir DIR --checkpoint-every K`` the run is saved
every K steps (atomically; the last ``--keep`` are kept), and a restart resumes from the
newest checkpoint in DIR, exactly: ``torchrun --max-restarts 3`` then survives a killed
process with the same final parameters, bit for bit (``--out`` writes them), and
``--nnodes MIN:MAX`` survives a lost machine, resharding the data.

Every process builds the same program and runs a ``ParallelExecutor`` over its local
places. An ``EpochSampler`` decides which samples each rank trains at each step (a
shuffled order per epoch, the same on every rank; rank r trains the r-th share of each
global batch), and its position is part of every checkpoint. Rank 0 prints the loss
averaged over all processes, which is the loss one process would get training on the
whole global batch.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ssaexec as se  # noqa: E402
from ssaexec.dist import world as dist  # noqa: E402
from ssaexec.program.example_models import build_mlp, make_optimizer  # noqa: E402

IN_DIM, HIDDEN, CLASSES = 32, (64, 32), 10


def synthetic_dataset(n, dtype="float32", seed=0, shape=(IN_DIM,), label="label"):
    """``n`` samples of a learnable task (the label depends on the input); same on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *shape, generator=g, dtype=getattr(torch, dtype))
    w = torch.randn(x[0].numel(), CLASSES, generator=g, dtype=x.dtype)
    return {"img": x, label: (x.reshape(n, -1) @ w).argmax(dim=1, keepdim=True)}


class SmallCNN(torch.nn.Module):
    """conv-relu-pool and a linear classifier, for 1x8x8 images (``--model cnn``)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 4 * 4, CLASSES)

    def forward(self, img):  # the argument's name is the program's feed
        h = torch.nn.functional.max_pool2d(torch.relu(self.conv(img)), 2)
        return self.fc(h.flatten(1))


def build(model, dtype, lr, seed):
    """(main, startup, loss, sample shape, label feed) of ``model``: ``mlp``, built with
    the layers API, or ``cnn``, a ``torch.nn`` CNN imported with ``se.from_torch``."""
    optimizer = make_optimizer("momentum", lr)
    if model == "mlp":
        return (*build_mlp(dtype, optimizer, seed=seed, in_dim=IN_DIM, hidden=HIDDEN,
                           classes=CLASSES), (IN_DIM,), "label")
    torch.manual_seed(seed)  # the module's initial weights (rank 0's are broadcast anyway)
    net = SmallCNN().to(getattr(torch, dtype))
    shape = (1, 8, 8)
    example = synthetic_dataset(2, dtype, seed, shape, "target")  # from_torch's label feed

    def loss_fn(logits, target):
        return torch.nn.functional.cross_entropy(logits, target.reshape(-1))
    main, startup, loss = se.from_torch(net, example, loss_fn=loss_fn, optimizer=optimizer)
    return main, startup, loss, shape, "target"


def train(steps=5, batch_size=64, places=None, dtype="float32", lr=0.05, seed=0, log=print,
          samples=None, shuffle=True, checkpoint_dir=None, checkpoint_every=None, keep=3,
          resume=True, out=None, sample_log=None, model="mlp"):
    """Train until ``steps`` steps of ``batch_size`` samples (global, over all processes).

    With ``checkpoint_dir``, resume from its newest checkpoint first (``resume``) and save
    every ``checkpoint_every`` steps. ``sample_log``: a file every rank appends
    ``<attempt> <step> <epoch> <sample indices>`` to after each step (for tests that count
    samples). Returns the losses averaged over processes, one per step run here.
    """
    world, rank = dist.world_size(), dist.rank()
    main, startup, loss, shape, label = build(model, dtype, lr, seed)
    # the same dataset on every rank
    data = synthetic_dataset(samples or steps * batch_size, dtype, seed, shape, label)
    sampler = se.EpochSampler(len(data["img"]), batch_size, seed=seed, shuffle=shuffle)
    ckpts = se.Checkpoints(checkpoint_dir, every=checkpoint_every, keep=keep, log=log) \
        if checkpoint_dir else None
    places = places or dist.local_places()
    losses = []
    # A process group of several processes makes the executor distributed by itself
    # (BuildStrategy's num_trainers and trainer_id come from it).
    with se.ParallelExecutor(places, main, startup, loss, scope=se.Scope()) as pe, \
            se.elastic.guard(ckpts) as run:
        start = ckpts.resume(pe, sampler) if ckpts is not None and resume else 0
        for step in range(start, steps):
            run.step = step + 1
            epoch, idx = sampler.epoch, sampler.next_indices()
            feed = {k: v[idx] for k, v in data.items()}
            local_loss, = pe.run([loss], feed=feed)
            global_loss = float(dist.average(local_loss))  # a collective: every rank calls it
            losses.append(global_loss)
            if sample_log:
                with open(sample_log, "a") as f:  # one append per step and rank
                    f.write(f"{run.token} {step + 1} {epoch} "
                            f"{' '.join(map(str, idx.tolist()))}\n")
            if rank == 0:
                log(f"step {step} loss {global_loss:.9g}")
            if ckpts is not None:
                ckpts.maybe_save(pe, step + 1, sampler)
        if out and ("{rank}" in out or rank == 0):  # "{rank}": one file per rank
            se.save_parameters(out.format(rank=rank), pe)
    if rank == 0:
        log(f"trained {steps} steps on {world} process(es) x {len(places)} place(s)")
    return losses


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5, help="steps in all (a resume continues)")
    ap.add_argument("--batch-size", type=int, default=64, help="global, over all processes")
    ap.add_argument("--samples", type=int, default=None,
                    help="dataset size (default: steps x batch size, one epoch)")
    ap.add_argument("--no-shuffle", action="store_true", help="every epoch in dataset order")
    ap.add_argument("--places", type=int, default=None,
                    help="places per process (default: the cores shared among processes)")
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp",
                    help="mlp: the layers API; cnn: a torch.nn CNN imported with se.from_torch")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--backend", default=None, help="gloo or nccl (default: by place kind)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds a collective may wait")
    ap.add_argument("--checkpoint-dir", default=None, help="save and resume here")
    ap.add_argument("--checkpoint-every", type=int, default=None, metavar="K",
                    help="save after every K-th step (needs --checkpoint-dir)")
    ap.add_argument("--keep", type=int, default=3, help="checkpoints kept (the newest)")
    ap.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                    help="continue from the newest checkpoint in --checkpoint-dir (default)")
    ap.add_argument("--out", default=None,
                    help="write the final parameters here (safetensors; rank 0's, or every "
                         "rank's where the name holds {rank})")
    ap.add_argument("--sample-log", default=None, help=argparse.SUPPRESS)  # for tests
    args = ap.parse_args(argv)
    if args.checkpoint_every and not args.checkpoint_dir:
        ap.error("--checkpoint-every needs --checkpoint-dir")
    info = dist.init(backend=args.backend, timeout=args.timeout)
    if args.batch_size % info.world_size:
        ap.error(f"--batch-size {args.batch_size} must be a multiple of the "
                 f"{info.world_size} processes")
    places = dist.local_places(args.places)
    if info.rank == 0:
        print(f"{info.world_size} process(es), backend {info.backend}, places per process: "
              f"{', '.join(str(p) for p in places)}", flush=True)
    train(args.steps, args.batch_size, places, args.dtype, args.lr, samples=args.samples,
          shuffle=not args.no_shuffle, checkpoint_dir=args.checkpoint_dir,
          checkpoint_every=args.checkpoint_every, keep=args.keep, resume=args.resume,
          out=args.out, sample_log=args.sample_log, model=args.model,
          log=lambda s: print(s, flush=True))
    dist.shutdown()


if __name__ == "__main__":
    main()
