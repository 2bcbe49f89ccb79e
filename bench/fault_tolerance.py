"""What faults cost, measured (issue 33): kill-and-resume runs, and a node cut off or lost.

``python bench/fault_tolerance.py resume [--runs 10] [--seed 0]``
    Each run trains ``examples/train_distributed.py`` (the MLP, 2 processes, 16 steps,
    a checkpoint every 2) under ``torchrun --standalone --max-restarts 3`` with 1 to 3
    crashes drawn at random (seeded): ``SSAEXEC_FAULT`` kills a random rank with SIGKILL in
    the middle of a random step (at its first all-reduce) or while it writes a random
    checkpoint (after the write, before the rename). Each crash lands in the next attempt,
    at a step after the one before. The final parameters must equal the run nobody
    killed, bit for bit. Prints, per run: the crashes, the resumes, the steps redone,
    the wall time against the clean run's.

``python bench/fault_tolerance.py cut|kill|join [--timeout 10]``   (root: namespaces)
    3 nodes x 2 processes under ``torchrun --nnodes 1:3 --max-restarts 3`` (24 steps, a
    checkpoint every 2); once step 6's checkpoint exists, node 2's link is cut (``cut``) or
    every process of node 2 is SIGKILLed (``kill``); ``join`` starts with 2 nodes and node
    2 joins then. Measured from that moment: when each node's first line appears, when
    each torchrun exits, when training resumes on the new world, and the steps redone.
    ``--json`` writes the figures.
"""

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(1, ROOT)  # tests.<folder>.test_x: tests/ mirrors the package
EXAMPLE = os.path.join(ROOT, "examples", "train_distributed.py")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
STEPS, EVERY = 16, 2


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC",
                                "SSAEXEC_FAULT"))}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _params(path):
    from safetensors.torch import load_file
    return load_file(path)


def _run(folder, name, fault=None):
    ck, out = os.path.join(folder, f"ck-{name}"), os.path.join(folder, f"{name}.st")
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "3",
           "--monitor-interval", "0.5", EXAMPLE, "--places", "1", "--steps", str(STEPS),
           "--batch-size", "16", "--samples", "64", "--checkpoint-every", str(EVERY),
           "--checkpoint-dir", ck, "--out", out, "--timeout", "30"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=_env(**({"SSAEXEC_FAULT": fault} if fault else {})))
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{name} failed ({fault}):\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return out, wall, p.stdout + p.stderr


def _plan(rng):
    """1 to 3 crashes, each at a later step than the one before (each attempt meets one)."""
    faults, step = [], 0
    for _ in range(rng.randint(1, 3)):
        if step >= STEPS - 2:
            break
        if rng.random() < 0.5:  # in the middle of a step
            step = rng.randint(step + 1, STEPS)
            faults.append(("step", step))
        else:  # while writing a checkpoint (saves follow every EVERY-th step)
            first = (step // EVERY + 1) * EVERY
            step = rng.randrange(first, STEPS + 1, EVERY)
            faults.append(("save", step))
    # rank 0 writes the checkpoints: a save crash is rank 0's; a step crash any rank's
    return [(w, s, rng.randint(0, 1) if w == "step" else 0) for w, s in faults]


def resume(args):
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="ssaexec-faults-") as folder:
        clean_path, clean_wall, _ = _run(folder, "clean")
        clean = _params(clean_path)
        print(f"clean run: {STEPS} steps, 2 processes, {clean_wall:.1f} s")
        print(f"{'run':>3s}  {'crashes (where:step:rank)':38s} {'resumed from':16s} "
              f"{'redone':>6s} {'wall s':>7s} {'x clean':>7s}  bit-identical")
        rows, ok = [], 0
        for i in range(args.runs):
            plan = _plan(rng)
            fault = ",".join(f"kill@{w}:{s}:{r}" for w, s, r in plan)
            path, wall, log = _run(folder, f"run{i}", fault)
            got = _params(path)
            same = got.keys() == clean.keys() and all(
                got[k].dtype == clean[k].dtype and bool((got[k] == clean[k]).all())
                and got[k].shape == clean[k].shape for k in clean)
            ok += same
            # every start says where it starts; the first is the run's own
            resumed = [int(s or 0) for s in re.findall(
                r"^(?:resumed from \S+step-(\d+)|no checkpoint in )", log, re.M)][1:]
            # a crash in step s had finished s - 1 steps, one in the save after step s had
            # finished s; those after the checkpoint it resumes from (r) are done again
            redone = sum((s - 1 if w == "step" else s) - r
                         for (w, s, _), r in zip(plan, resumed, strict=True))
            rows.append({"run": i, "faults": fault, "resumed_from": resumed,
                         "steps_redone": redone, "wall_s": wall,
                         "wall_over_clean": wall / clean_wall, "bit_identical": same})
            print(f"{i:3d}  {fault:38s} {str(resumed):16s} {redone:6d} {wall:7.1f} "
                  f"{wall / clean_wall:7.2f}  {'yes' if same else 'NO'}", flush=True)
        print(f"\n{ok} of {args.runs} runs ended with the clean run's parameters, bit for bit")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"clean_wall_s": clean_wall, "runs": rows}, f, indent=1)
    return 0 if ok == args.runs else 1


def lose(args):
    import netns
    why = netns.available()
    if why:
        raise SystemExit(f"cannot make network namespaces: {why}")
    from tests.integration.test_multinode import _torchrun
    folder = tempfile.mkdtemp(prefix="ssaexec-lose-")
    ck = os.path.join(folder, "ck")
    steps = 240 if args.mode == "join" else 24  # a join must land while training runs
    targs = ["--places", "1", "--steps", str(steps), "--batch-size", "12", "--samples", "48",
             "--checkpoint-dir", ck, "--checkpoint-every", "2", "--timeout", str(args.timeout)]
    logs = [os.path.join(folder, f"node{i}.log") for i in range(3)]
    env = _env(GLOO_SOCKET_IFNAME="eth0")
    if args.mode == "join" or args.unshared_store:
        # torch 2.13's shared rendezvous store cannot take a node joining a running group
        # (its agent waits for a store address nobody republishes): docs/distributed.md
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    marks = {}
    def start(cluster, i):
        return cluster.run(i, _torchrun(cluster, i, "1:3", 2, args.mode, targs,
                                        conf={"last_call_timeout": 3}, max_restarts=3),
                           logs[i], env=env, cwd=ROOT)
    with netns.Cluster(3) as cluster:
        procs = [start(cluster, i) for i in range(2 if args.mode == "join" else 3)]
        while not os.path.exists(os.path.join(ck, "step-00000006.safetensors")):
            time.sleep(0.02)  # a file another process writes: polled
        if args.mode == "join":
            procs.append(start(cluster, 2))
        else:
            (cluster.cut if args.mode == "cut" else cluster.kill_node)(2)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 300 and any(p.poll() is None for p in procs):
            texts = [open(p).read() for p in logs]
            for i, text in enumerate(texts):
                if f"line{i}" not in marks and re.search(r"^ssaexec: rank \d+ of 6 stopped",
                                                         text, re.M):
                    marks[f"line{i}"] = time.monotonic() - t0
                if f"exit{i}" not in marks and procs[i].poll() is not None:
                    marks[f"exit{i}"] = time.monotonic() - t0
            if "resumed" not in marks and re.search(r"now [46]\)", texts[0]):
                marks["resumed"] = time.monotonic() - t0
            if "finished" not in marks and f"trained {steps} steps" in texts[0]:
                marks["finished"] = time.monotonic() - t0
            time.sleep(0.02)
        codes = [p.returncode for p in procs]
        text = open(logs[0]).read() + open(logs[1]).read()
    stopped = [int(s) for s in re.findall(r"stopped at step (\d+): (?:rank\(s\)|torchrun)",
                                          text)]
    resumed = re.findall(r"resumed from \S+step-(\d+)", text)
    figures = {"mode": args.mode, "timeout_s": args.timeout, "exit_codes": codes,
               "shared_store": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in env,
               "seconds_after_fault": marks,
               "step_at_failure": max(stopped) if stopped else None,
               "resumed_from": int(resumed[0]) if resumed else None}
    if stopped and resumed:
        figures["steps_redone"] = max(stopped) - 1 - int(resumed[0])
    print(json.dumps(figures, indent=1))
    print(f"logs in {folder}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0 if codes[:2] == [0, 0] and f"trained {steps} steps" in text else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["resume", "cut", "kill", "join"])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=10.0,
                    help="the collective timeout (cut/kill)")
    ap.add_argument("--unshared-store", action="store_true",
                    help="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for cut/kill too (join: always)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    return resume(args) if args.mode == "resume" else lose(args)


if __name__ == "__main__":
    sys.exit(main())
