"""Several machines, for real: torchrun nodes in network namespaces (``tests/netns.py``).

Each "node" is a network namespace with its own address (10.77.0.x, which exists only
inside the namespaces this test makes) running ``torchrun --nnodes ... --rdzv-backend c10d
--rdzv-endpoint <node 0>:29400`` on ``examples/train_distributed.py``. What must hold:

* 2 nodes x 2 processes train exactly what 1 process x 4 places trains (float64, 1e-12),
  for the MLP and for a CNN imported with ``from_torch``;
* a process killed with SIGKILL in the middle of a step, then another killed while it
  writes a checkpoint, under ``torchrun --max-restarts 3``: the same final parameters, bit
  for bit, as the run nobody killed;
* of 3 nodes under ``--nnodes 1:3``, one whose link is cut: every process exits within the
  collective timeout plus 10 s with one line (the survivors name the lost ranks), the two
  others restart and finish, every sample of every epoch is trained exactly once (counted
  from the ranks' sample logs), and every rank ends with the same parameters.

Needs root for the namespaces; skips with the reason otherwise. Every test removes its
namespaces and kills its processes, pass or fail.
"""

import collections
import os
import re
import subprocess
import sys
import time

import pytest
import torch

import netns

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "train_distributed.py")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
PORT = 29400

_why = netns.available()
pytestmark = [pytest.mark.slow, pytest.mark.processes, pytest.mark.timeout(240),
              pytest.mark.skipif(_why is not None, reason=_why or "")]


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC",
                                "SSAEXEC_FAULT", "GROUP_RANK"))}
    env.update(PYTHONPATH=REPO, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               GLOO_SOCKET_IFNAME="eth0")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _torchrun(cluster, i, nnodes, nproc, run_id, args, **torchrun_kw):
    conf = [f"is_host={int(i == 0)}"] + [f"{k}={v}" for k, v in torchrun_kw.pop("conf", {}).items()]
    return [TORCHRUN, "--nnodes", str(nnodes), "--node-rank", str(i), "--nproc-per-node",
            str(nproc), "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"{cluster.addr(0)}:{PORT}", "--rdzv-id", run_id, "--rdzv-conf", ",".join(conf),
            "--local-addr", cluster.addr(i), "--max-restarts",
            str(torchrun_kw.pop("max_restarts", 0)), "--monitor-interval", "0.5",
            EXAMPLE, *args]


def _wait(procs, timeout, logs):
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail(f"torchrun did not finish in {timeout} s\n" + _tails(logs))
    return [p.returncode for p in procs]


def _tails(logs):
    return "\n".join(f"--- {os.path.basename(p)} ---\n{_read(p)[-4000:]}" for p in logs)


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _params(path):
    from safetensors.torch import load_file
    return load_file(path)


def _reference(tmp_path, model, steps, batch):
    """1 process x 4 places, in this process: the example's own ``train``."""
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    try:
        import train_distributed as example
    finally:
        sys.path.pop(0)
    import ssaexec as se
    out = str(tmp_path / f"ref-{model}.safetensors")
    example.train(steps, batch, se.cpu_places(4), "float64", model=model, out=out,
                  log=lambda s: None)
    return _params(out)


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_two_nodes_of_two_processes_equal_one_process_of_four_places(tmp_path, model):
    steps, batch = 4, 8
    out = str(tmp_path / "nodes.safetensors")
    args = ["--model", model, "--dtype", "float64", "--places", "1", "--steps", str(steps),
            "--batch-size", str(batch), "--timeout", "60", "--out", out]
    logs = [str(tmp_path / f"node{i}.log") for i in range(2)]
    with netns.Cluster(2) as cluster:
        procs = [cluster.run(i, _torchrun(cluster, i, 2, 2, f"eq-{model}", args), logs[i],
                             env=_env(), cwd=REPO) for i in range(2)]
        assert _wait(procs, 180, logs) == [0, 0], _tails(logs)
    assert "4 process(es), backend gloo" in _read(logs[0]) + _read(logs[1]), _tails(logs)
    got, ref = _params(out), _reference(tmp_path, model, steps, batch)
    assert got.keys() == ref.keys()
    for name in ref:
        assert torch.allclose(got[name], ref[name], rtol=0, atol=1e-12), name


def _standalone(tmp_path, name, args, fault=None, timeout=180):
    log = str(tmp_path / f"{name}.log")
    env = _env(**({"SSAEXEC_FAULT": fault} if fault else {}))
    env.pop("GLOO_SOCKET_IFNAME")
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", "2", "--max-restarts", "3",
           "--monitor-interval", "0.5", EXAMPLE, *args]
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        rc = _wait([p], timeout, [log])[0]
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait(10)
    return rc, _read(log)


def test_killed_mid_step_and_mid_save_resumes_bit_for_bit(tmp_path):
    args = ["--dtype", "float32", "--places", "1", "--steps", "10", "--batch-size", "16",
            "--samples", "64", "--checkpoint-every", "2", "--timeout", "30"]
    rc, log = _standalone(tmp_path, "clean", args + [
        "--checkpoint-dir", str(tmp_path / "ck-clean"), "--out", str(tmp_path / "clean.st")])
    assert rc == 0, log
    # attempt 0: rank 1 dies at step 5's first all-reduce (checkpoints 2 and 4 exist);
    # attempt 1 resumes from step 4, and rank 0 dies writing step 8's checkpoint; attempt 2
    # resumes from step 6 and finishes
    ck = tmp_path / "ck-killed"
    rc, log = _standalone(tmp_path, "killed", args + [
        "--checkpoint-dir", str(ck), "--out", str(tmp_path / "killed.st")],
        fault="kill@step:5:1,kill@save:8:0")
    assert rc == 0, log
    assert re.findall(r"resumed from \S+step-(\d+)\.safetensors", log) == ["00000004",
                                                                           "00000006"], log
    assert "removed .ckpt-" in log and "a save that did not finish" in log, log
    # rank 1's death: torchrun stops rank 0 too (one machine), which says so in one line.
    # Rank 1 reaches step 5 only after rank 0 has finished step 4's save (the save ends in a
    # barrier), so checkpoint 4 exists whatever the timing; rank 0 is in step 5 then, or
    # still on its way out of step 4 if torchrun's SIGTERM is quick (both lines are true)
    assert re.search(r"ssaexec: rank 0 of 2 stopped at step [45]: (torchrun stopped this "
                     r"worker|rank\(s\) 1 lost).*last checkpoint \S+step-00000004", log), log
    got, ref = _params(tmp_path / "killed.st"), _params(tmp_path / "clean.st")
    assert got.keys() == ref.keys()
    for name in ref:
        assert torch.equal(got[name], ref[name]), name  # bit for bit
    assert sorted(os.listdir(ck)) == [f"step-{s:08d}.safetensors" for s in (6, 8, 10)]


def _sample_history(path):
    """{step: (epoch, [samples])} of the last attempt that ran each step (all its ranks)."""
    last = {}  # step -> token of the latest attempt seen (file order is time order)
    rows = collections.defaultdict(list)
    for line in _read(path).splitlines():
        token, step, epoch, *idx = line.split()
        step = int(step)
        last[step] = token
        rows[(step, token)].append((int(epoch), [int(i) for i in idx]))
    history = {}
    for step, token in last.items():
        epochs = {e for e, _ in rows[(step, token)]}
        assert len(epochs) == 1, (step, epochs)
        history[step] = (epochs.pop(), sorted(i for _, idx in rows[(step, token)] for i in idx))
    return history


def test_a_node_cut_off_of_three_is_detected_and_the_run_finishes_on_two(tmp_path):
    steps, batch, samples, timeout = 24, 12, 48, 10  # 4 steps an epoch, 6 epochs
    ck, slog = tmp_path / "ck", str(tmp_path / "samples.txt")
    args = ["--places", "1", "--steps", str(steps), "--batch-size", str(batch), "--samples",
            str(samples), "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
            "--timeout", str(timeout), "--sample-log", slog,
            "--out", str(tmp_path / "final-{rank}.st")]
    logs = [str(tmp_path / f"node{i}.log") for i in range(3)]
    conf = {"last_call_timeout": 3}
    with netns.Cluster(3) as cluster:
        procs = [cluster.run(i, _torchrun(cluster, i, "1:3", 2, "cut", args, conf=conf,
                                          max_restarts=3), logs[i], env=_env(), cwd=REPO)
                 for i in range(3)]
        # the cut comes once the 6 processes have trained and checkpointed step 6
        deadline = time.monotonic() + 120
        while not (ck / "step-00000006.safetensors").exists():
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
                _tails(logs)
            time.sleep(0.05)  # a file written by another process: nothing to wait on
        cluster.cut(2)
        codes = _wait(procs, 180, logs)
        # the cut-off node's torchrun was ended by its workers (blocked on the dead link)
        assert codes[:2] == [0, 0] and codes[2] != 0, _tails(logs)
        node2 = _read(logs[2])
    text = _read(logs[0]) + _read(logs[1])
    # the survivors named the cut-off node's ranks and the checkpoint they resume from
    lost = re.findall(r"ssaexec: rank \d of 6 stopped at step \d+: rank\(s\) ([\d, ]+) lost "
                      r"\(no answer within 3 s\); last checkpoint \S+step-(\d+)", text)
    assert lost and all(r == lost[0][0] for r, _ in lost) and len(lost[0][0].split(",")) == 2, \
        _tails(logs)
    assert "does not answer (this node is cut off" in node2, node2[-3000:]
    assert "ending this machine's torchrun" in node2, node2[-3000:]
    assert re.search(r"resumed from \S+ \(step \d+, saved by 6 process\(es\), now 4\)", text)
    assert "trained 24 steps on 4 process(es)" in text, _tails(logs)
    # every sample of every epoch exactly once, in the steps that count
    history = _sample_history(slog)
    assert sorted(history) == list(range(1, steps + 1))
    per_epoch = collections.defaultdict(list)
    for epoch, idx in history.values():
        per_epoch[epoch].extend(idx)
    assert sorted(per_epoch) == list(range(steps * batch // samples))
    for epoch, idx in per_epoch.items():
        assert sorted(idx) == list(range(samples)), epoch
    # every rank of the final world ends with the same parameters
    finals = [_params(tmp_path / f"final-{r}.st") for r in range(4)]
    for f in finals[1:]:
        assert all(torch.equal(f[k], finals[0][k]) for k in finals[0])
