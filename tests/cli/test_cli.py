"""The ``ssaexec`` command line: every subcommand on every example, and every error path.

Each CLI invocation runs in its own process. Importing torch costs seconds per
process, so most invocations come from a *fork server*: one helper process
imports ``ssaexec.cli`` (and warms the lazily imported parts of torch and
matplotlib) without running any kernels, then forks one child per invocation,
which sets argv, cwd and environment, redirects stdout/stderr to files and
calls ``ssaexec.cli.main``; its exit status is the CLI's. A few tests run the
real console script / ``python -m ssaexec`` as ordinary subprocesses (the
entry points, a PATH without Graphviz). ``SSAEXEC_TEST_NO_FORK=1`` (or a
platform without ``fork``) runs everything as ordinary subprocesses.
"""

import collections
import itertools
import json
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

import ssaexec as se
from ssaexec.cli import ProgressBar, default_startup, loss_var
from ssaexec.graph import analysis
from ssaexec.graph.draw import find_dot
from ssaexec.graph.export import op_graph
from ssaexec.graph.ssa import ComputationOpHandle, SSAGraph
from ssaexec.core.dtypes import torch_dtype
from ssaexec.program.desc import OpDesc, Program
from ssaexec.program.io import load_program

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = ROOT / "examples"
EXAMPLES = ["uci_housing.json", "seed_mlp.json", "mnist_mlp.json", "small_resnet.json",
            "seed_mlp.ssa"]
PLACES = "cpu:2"  # explicit, so a CUDA machine builds the same graphs as the tests do here
CALL_TIMEOUT = 240

_SERVER = textwrap.dedent("""
    import json, os, sys, traceback
    import ssaexec.cli as cli
    from ssaexec.program.io import load_program
    load_program(sys.argv[1]).validate()   # warms torch's lazily imported shape inference
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot
    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.chdir(req["cwd"])
                os.environ.clear()
                os.environ.update(req["env"])
                out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(out, 1)
                os.dup2(err, 2)
                code = cli.main(req["argv"])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), flush=True)
""")


class Result:
    __slots__ = ("status", "out", "err")

    def __init__(self, status, out, err):
        self.status, self.out, self.err = status, out, err

    def __repr__(self):
        return f"<status {self.status}\nstdout:\n{self.out}\nstderr:\n{self.err}>"


def _env(extra=None):
    env = dict(os.environ)
    env.pop("SSAEXEC_DOT", None)
    env.update(extra or {})
    return env


def run_subprocess(argv, env=None, cwd=ROOT, full_env=None):
    """``python -m ssaexec ARGV`` as an ordinary subprocess (``full_env`` replaces the env)."""
    proc = subprocess.run([sys.executable, "-m", "ssaexec", *map(str, argv)], cwd=cwd,
                          env=full_env if full_env is not None else _env(env),
                          capture_output=True, text=True, timeout=CALL_TIMEOUT)
    return Result(proc.returncode, proc.stdout, proc.stderr)


class ForkServer:
    def __init__(self, tmp):
        self.tmp = tmp
        self.count = 0
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER,
                                      str(EXAMPLES_DIR / "uci_housing.json")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=ROOT, env=_env())
        line = self._readline(120)
        assert line.strip() == "ready", line

    def _readline(self, timeout):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        return self.proc.stdout.readline()

    def __call__(self, argv, env=None, cwd=ROOT):
        self.count += 1
        out, err = self.tmp / f"out{self.count}", self.tmp / f"err{self.count}"
        req = {"argv": [str(a) for a in argv], "env": _env(env), "cwd": str(cwd),
               "stdout": str(out), "stderr": str(err)}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        pid = json.loads(self._readline(30))["pid"]
        line = self._readline(CALL_TIMEOUT)
        if line is None:
            os.kill(pid, signal.SIGKILL)
            self._readline(30)
            raise AssertionError(f"ssaexec {' '.join(map(str, argv))} took longer than "
                                 f"{CALL_TIMEOUT} s")
        status = json.loads(line)["status"]
        return Result(status, out.read_text(), err.read_text())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """``cli(argv, env=None, cwd=ROOT) -> Result``: one process per invocation."""
    if os.environ.get("SSAEXEC_TEST_NO_FORK") or not hasattr(os, "fork"):
        yield run_subprocess
        return
    server = ForkServer(tmp_path_factory.mktemp("cli"))
    try:
        yield server
    finally:
        server.close()


def example(name):
    return EXAMPLES_DIR / name


_graphs = {}


def graph_of(name, places=2):
    """The SSA graph the CLI builds for an example (cpu places, default strategy, fetch loss)."""
    key = (name, places)
    if key not in _graphs:
        program = load_program(example(name))
        _graphs[key] = se.build_ssa_graph(program, se.cpu_places(places), se.BuildStrategy(),
                                          [loss_var(program)])
    return _graphs[key]


def assert_clean_error(res, *needles):
    assert res.status == 2, res
    assert "Traceback" not in res.err, res
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("ssaexec: error: "), res
    for n in needles:
        assert n in res.err, (n, res)


def svg_ids(path):
    root = ET.parse(path).getroot()  # also: the file is well-formed XML
    assert root.tag.endswith("svg")
    return {el.get("id") for el in root.iter() if el.get("id")}


# --- dump --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_dump_names_every_op_and_collective(cli, name):
    res = cli(["dump", example(name), "--places", PLACES])
    assert res.status == 0, res
    g = graph_of(name)
    lines = {int(m.group(1)): ln for ln in res.out.splitlines()
             if (m := re.match(r"#(\d+)\s", ln))}
    assert sorted(lines) == list(range(len(g.ops)))
    for op in g.ops:
        line = lines[op.id]
        assert op.kind in line and op.name in line
        for v in op.inputs:
            assert (f"~{v.name}(" if v.is_dummy else f"{v.name}@v{v.version}") in line
    assert g.collectives and all(op.kind == "all_reduce" for op in g.collectives)
    for op in g.collectives:
        assert f"all_reduce({op.var_names[0]})" in lines[op.id]
        assert "[cpu:0]" in lines[op.id] and "[cpu:1]" in lines[op.id]
    assert "war <- #" in res.out and "collective_order -> #" in res.out  # dummy edges marked


def test_dump_formats_and_options(cli, tmp_path):
    g = graph_of("seed_mlp.json")
    res = cli(["dump", example("seed_mlp.json"), "--places", PLACES, "--format", "json"])
    assert res.status == 0, res
    doc = json.loads(res.out)
    assert [o["id"] for o in doc["ops"]] == list(range(len(g.ops)))
    assert [o["name"] for o in doc["ops"]] == [op.name for op in g.ops]
    assert doc["collective_order"] == [op.id for op in g.collectives]
    dot = tmp_path / "g.dot"
    res = cli(["dump", example("seed_mlp.json"), "--places", PLACES, "-f", "dot", "-o", dot])
    assert res.status == 0 and res.out == "", res
    text = dot.read_text()
    assert all(f'"op:{op.id}"' in text for op in g.ops) and "style=dashed" in text
    # reduce strategy, another loss scale and a selection
    res = cli(["dump", example("uci_housing.ssa"), "--places", "cpu:3", "--reduce-strategy",
               "reduce", "--gradient-scale", "one", "--block", "comm", "--fetch", ""])
    assert res.status == 0, res
    assert "reduce(" in res.out and "broadcast(" in res.out and "sgd#" not in res.out
    assert "fetch: none" in res.out and "gradient_scale=one" in res.out
    res = cli(["dump", example("small_resnet.json"), "--places", PLACES, "--collapse",
               "--filter", r"^conv2d#0@"])
    assert res.status == 0, res
    shown = [ln for ln in res.out.splitlines() if re.match(r"#\d", ln)]
    assert len(shown) == 1 and "conv2d#0@cpu:0" in shown[0]


def test_dump_zero_shows_the_gathers_reduce_scatters_and_frees(cli):
    res = cli(["dump", example("seed_mlp.json"), "--places", "cpu:2", "--zero", "3",
               "--block", "comm"])
    assert res.status == 0, res
    counts = {k: len(re.findall(rf"^#\d+\s+{k}\s", res.out, re.M))
              for k in ("all_gather", "reduce_scatter", "free", "all_reduce")}
    # 2 layers of a weight and a bias: each layer gathered by one call for forward and
    # for backward, each parameter freed after (2 places); each layer's gradients
    # reduce-scattered by one call and freed
    assert counts == {"all_gather": 4, "reduce_scatter": 2, "free": 20, "all_reduce": 0}
    assert "prefetch" in res.out
    res = cli(["dump", example("seed_mlp.json"), "--places", "cpu:2", "--zero", "3",
               "--keep-after-forward", "--zero-prefetch", "0"])
    assert res.status == 0 and len(re.findall(r"^#\d+\s+all_gather\s", res.out, re.M)) == 2
    res = cli(["dump", example("seed_mlp.json"), "--zero", "3", "--zero-prefetch", "-1"])
    assert res.status == 2 and "--zero-prefetch must be >= 0" in res.err


def test_dump_passes_shows_the_graph_after_each_pass(cli, tmp_path):
    from ssaexec.graph.passes import PASS_NAMES
    g = graph_of("seed_mlp.json")
    res = cli(["dump", example("seed_mlp.json"), "--places", PLACES, "--passes"])
    assert res.status == 0, res
    heads = re.findall(r"^## pass (\d+)/(\d+) (\w+): ", res.out, re.M)
    assert [(int(k), name) for k, _, name in heads] == list(enumerate(PASS_NAMES, 1))
    sections = re.split(r"^## pass .*\n", res.out, flags=re.M)[1:]
    first, last = sections[0], sections[-1]
    assert "all_reduce(" not in first and "fetch(" not in first  # replicate: compute only
    plain = cli(["dump", example("seed_mlp.json"), "--places", PLACES])
    assert last == plain.out  # the last pass's graph is the graph
    # only some passes, in pipeline order; JSON: one graph per pass
    res = cli(["dump", example("seed_mlp.json"), "--places", PLACES, "-f", "json",
               "--passes", "fetch,insert_collectives"])
    assert res.status == 0, res
    doc = json.loads(res.out)
    assert [(p["index"], p["name"]) for p in doc["passes"]] == \
        [(5, "insert_collectives"), (len(PASS_NAMES), "fetch")]
    assert [o["name"] for o in doc["passes"][-1]["graph"]["ops"]] == [op.name for op in g.ops]
    assert doc["passes"][0]["graph"]["num_ops"] == len(g.ops) - len(g.fetches)
    # DOT to a file: one file per pass, named as debug_graphviz_path names them
    res = cli(["dump", example("seed_mlp.json"), "--places", PLACES, "-f", "dot",
               "--passes", "-o", tmp_path / "g.dot"])
    assert res.status == 0 and res.out == "", res
    files = sorted(p.name for p in tmp_path.glob("g.dot.*.dot"))
    assert files == [f"g.dot.{k:02d}_{n}.dot" for k, n in enumerate(PASS_NAMES, 1)]
    assert (tmp_path / f"g.dot.{len(PASS_NAMES):02d}_fetch.dot").read_text() \
        .startswith("digraph")


@pytest.mark.parametrize("argv,needle", [
    (["--passes", "bogus"], "unknown pass 'bogus'"),
    (["--passes", "replicate,nope"], "unknown pass 'nope'"),
    (["--passes", ","], "no pass named"),
    (["--passes", "seed_mlp.json"], "unknown pass 'seed_mlp.json'")])  # the program as NAMES
def test_dump_passes_refuses_unknown_pass_names(cli, argv, needle):
    program = [] if argv[-1] == "seed_mlp.json" else [example("seed_mlp.json")]
    res = cli(["dump", *program, "--places", PLACES, *argv])
    assert res.status == 2 and "Traceback" not in res.err, res
    last = [ln for ln in res.err.splitlines() if ln.strip()][-1]
    assert last.startswith("ssaexec dump: error: argument --passes: "), res
    assert needle in last and "the passes are replicate, gradient_scale" in last, res
    assert res.out == ""


# --- viz ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_viz_svg_with_graphviz(cli, tmp_path, name):
    if find_dot() is None:
        pytest.skip("Graphviz 'dot' is not installed (make graphviz)")
    out = tmp_path / "g.svg"
    res = cli(["viz", example(name), "-o", out, "--places", PLACES])
    assert res.status == 0, res
    assert "drawn with graphviz" in res.out and "note:" not in res.err
    ids = svg_ids(out)
    assert {f"op:{op.id}" for op in graph_of(name).ops} <= ids
    assert {"legend:all_reduce", "legend:compute"} <= ids


@pytest.mark.parametrize("name", EXAMPLES)
def test_viz_svg_without_graphviz(cli, tmp_path, name):
    out = tmp_path / "g.svg"
    argv = ["viz", example(name), "-o", out, "--places", PLACES]
    if name == "small_resnet.json":
        argv.append("--no-vars")  # every op handle still drawn; 5x fewer nodes to lay out
    res = cli(argv, env={"SSAEXEC_DOT": "/nonexistent/dot"})
    assert res.status == 0, res
    assert "drawn with matplotlib" in res.out
    notes = [ln for ln in res.err.splitlines() if ln.strip()]
    assert len(notes) == 1 and "Graphviz 'dot' not found" in notes[0], res
    ids = svg_ids(out)
    assert {f"op:{op.id}" for op in graph_of(name).ops} <= ids
    text = out.read_text()
    assert "all_reduce(" in text and "cpu:1" in text


@pytest.mark.slow
def test_viz_png_with_no_dot_on_path(tmp_path):
    # a real subprocess whose PATH has no Graphviz at all
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SSAEXEC_DOT"}
    env["PATH"] = str(empty)
    out = tmp_path / "g.png"
    res = run_subprocess(["viz", example("seed_mlp.json"), "-o", out, "--places", PLACES],
                         full_env=env)
    assert res.status == 0, res
    assert "Graphviz 'dot' not found" in res.err and "drawn with matplotlib" in res.out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_viz_selection_and_dot_output(cli, tmp_path):
    g = graph_of("small_resnet.json")
    out = tmp_path / "part.svg"
    res = cli(["viz", example("small_resnet.json"), "-o", out, "--places", PLACES,
               "--collapse", "--block", "comm,optimize", "--engine", "matplotlib"])
    assert res.status == 0, res
    ids = svg_ids(out)
    want = {f"op:{op.id}" for op in g.ops if op.kind == "all_reduce" or
            (op.kind == "compute" and op.op.role == "optimize" and op.place_idx == 0)}
    drawn = {i for i in ids if i.startswith("op:")}
    assert drawn == want
    dot = tmp_path / "g.dot"
    res = cli(["viz", example("seed_mlp.json"), "-o", dot, "--places", PLACES, "--no-vars"])
    assert res.status == 0 and "DOT source" in res.out, res
    assert dot.read_text().startswith("digraph ssa {")
    res = cli(["viz", example("seed_mlp.json"), "-o", tmp_path / "x.svg", "--filter", "nomatch"])
    assert_clean_error(res, "matched no op handle")


# --- stats -------------------------------------------------------------------------------------

def _bytes(program, name):
    var = program.global_block().find_var(name)
    return var.numel * torch_dtype(var.dtype).itemsize


@pytest.mark.parametrize("name", EXAMPLES)
def test_stats_match_the_graph(cli, name):
    res = cli(["stats", example(name), "--places", PLACES, "--format", "json"])
    assert res.status == 0, res
    st = json.loads(res.out)
    g = graph_of(name)
    n = len(g.places)
    assert st["ops"]["total"] == len(g.ops)
    assert st["ops"]["by_kind"] == dict(collections.Counter(op.kind for op in g.ops))
    assert st["ops"]["by_place"]["cpu:0"] == sum(getattr(op, "place_idx", None) == 0
                                                 for op in g.ops)
    assert st["vars"]["handles"] == sum(len(vs) for names in g.vars for vs in names.values())
    assert st["vars"]["dummies"] == len(g.dummies)
    og = op_graph(g)
    assert st["critical_path"]["length"] == nx.dag_longest_path_length(og) + 1
    assert st["max_width"]["level_schedule"] == max(len(gen) for gen in
                                                    nx.topological_generations(og))
    assert st["max_width"]["antichain"] >= st["max_width"]["level_schedule"]
    coll = st["collectives"]
    assert coll["count"] == len(g.collectives) == len(g.param_grads())
    payload = sum(_bytes(g.program, v) for op in g.collectives for v in op.var_names)
    assert coll["payload_bytes"] == payload
    assert coll["bytes_per_place"] == pytest.approx(2 * (n - 1) / n * payload)
    assert coll["bytes_on_wire"] == pytest.approx(2 * (n - 1) * payload)
    mem = st["memory"]
    params = g.program.all_parameters()
    assert mem["parameter_bytes"] == sum(_bytes(g.program, p.name) for p in params)
    assert mem["gradient_bytes"] == mem["parameter_bytes"]  # one gradient per parameter
    assert mem["total_bytes"] == n * mem["per_place_bytes"]


def test_stats_text(cli):
    res = cli(["stats", example("seed_mlp.ssa"), "--places", "cpu:4", "--reduce-strategy",
               "reduce"])
    assert res.status == 0, res
    for word in ("op handles", "critical path", "max width", "maximum antichain", "reduce",
                 "broadcast", "(n-1)/n", "parameters", "gradients", "cpu:3"):
        assert word in res.out, word


def test_stats_says_how_the_places_of_a_process_run(cli):
    # runtime.places_rule.describe: one line, threads or turns and why
    res = cli(["stats", example("seed_mlp.ssa"), "--places", "cpu:2"])
    assert res.status == 0, res
    line = next(ln for ln in res.out.splitlines() if ln.startswith("places run"))
    assert "threads or turns in one thread" in line and "one process per place" in line
    res = cli(["stats", example("seed_mlp.ssa"), "--places", "cpu:1", "--format", "json"])
    assert "caller's thread" in json.loads(res.out)["places_mode"]


def _hand_built():
    # place 0: a -> (b, c) -> d -> e ; place 1: f alone
    g = SSAGraph(Program(), se.cpu_places(2), se.BuildStrategy())
    ops = []

    def op(pi, reads, writes):
        h = g.add_op(ComputationOpHandle(OpDesc("relu"), len(ops), g.places[pi], pi))
        for name in reads:
            g.read(h, pi, name)
        for name in writes:
            g.write(h, pi, name)
        ops.append(h)
        return h

    op(0, [], ["x"])            # 0 a
    op(0, ["x"], ["y"])         # 1 b
    op(0, ["x"], ["z"])         # 2 c
    op(0, ["y", "z"], ["w"])    # 3 d
    op(0, ["w"], ["out"])       # 4 e
    op(1, [], ["q"])            # 5 f
    return g, ops


def test_analysis_on_a_hand_built_graph():
    g, ops = _hand_built()
    g.lint()
    assert analysis.op_levels(g) == [0, 1, 1, 2, 3, 0]
    length, chain = analysis.critical_path(g)
    assert length == 4 and [op.id for op in chain] == [0, 1, 3, 4]
    heavy = {2: 5}
    length, chain = analysis.critical_path(g, weight=lambda op: heavy.get(op.id, 1))
    assert length == 8 and [op.id for op in chain] == [0, 2, 3, 4]
    assert analysis.level_widths(g) == [2, 2, 1, 1]
    assert analysis.max_width(g) == (2, 0)
    assert analysis.max_antichain_size(g) == 3  # {b, c, f}
    st = analysis.graph_stats(g)
    assert st["critical_path"]["length"] == 4
    assert st["ops"]["by_place"] == {"cpu:0": 5, "cpu:1": 1}
    assert st["collectives"]["count"] == 0 and st["collectives"]["bytes_on_wire"] == 0


def test_max_antichain_matches_brute_force():
    # Dilworth via matching against a brute-force search on small random DAGs
    import random
    rng = random.Random(0)
    for _ in range(30):
        n = rng.randint(1, 9)
        edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < 0.3]
        g = SSAGraph(Program(), se.cpu_places(1), se.BuildStrategy())
        hs = [g.add_op(ComputationOpHandle(OpDesc("relu"), i, g.places[0], 0))
              for i in range(n)]
        for i, j in edges:
            g.depend(hs[i], hs[j], "test")
        closure = nx.transitive_closure_dag(nx.DiGraph(edges))
        reach = {(i, j) for i, j in closure.edges}
        best = max(len(s) for k in range(1, n + 1) for s in itertools.combinations(range(n), k)
                   if all((a, b) not in reach and (b, a) not in reach
                          for a, b in itertools.combinations(s, 2)))
        assert analysis.max_antichain_size(g) == best, (n, edges)


# --- run ---------------------------------------------------------------------------------------

def losses_of(out):
    return [float(x) for x in re.findall(r"^step\s+\d+/\d+\s+loss (\S+)", out, re.M)]


@pytest.mark.parametrize("name", EXAMPLES)
def test_run(cli, name):
    steps = 6 if name == "mnist_mlp.json" else 3
    batch = 4 if name == "small_resnet.json" else 8
    res = cli(["run", example(name), "--places", PLACES, "--steps", steps, "--batch", batch])
    assert res.status == 0, res
    losses = losses_of(res.out)
    assert len(losses) == steps and all(math.isfinite(v) for v in losses)
    assert re.search(r"throughput: [\d,.]+ images/sec", res.out), res
    stem, suffix = name.rsplit(".", 1)
    assert f"parameters: {example(f'{stem}.startup.{suffix}')}\n" in res.out, res
    if name == "mnist_mlp.json":
        assert all(b < a for a, b in itertools.pairwise(losses)), losses
        assert losses[-1] < 0.5 * losses[0], losses


def test_run_with_feed_file_and_default_init(cli, tmp_path):
    rng = np.random.default_rng(0)
    feed = tmp_path / "housing.npz"
    np.savez(feed, x=rng.standard_normal((64, 13)).astype("float32"),
             y=rng.standard_normal((64, 1)).astype("float32"))
    prog = tmp_path / "uci.json"
    shutil.copy(example("uci_housing.json"), prog)  # no startup file next to it
    res = cli(["run", prog, "--places", PLACES, "--steps", 4, "--batch", 16, "--feed", feed,
               "--threads", 1, "--lr", "0.05"])
    assert res.status == 0, res
    assert "16 of 64 rows per step" in res.out
    assert "defaults for 3 persistable vars" in res.out  # weight, bias, learning rate
    assert len(losses_of(res.out)) == 4
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=rng.standard_normal((8, 13)), y=rng.standard_normal((8, 1)))  # float64
    res = cli(["run", prog, "--places", PLACES, "--steps", 1, "--feed", bad])
    assert_clean_error(res, "feed 'x' has dtype float64", "float32")


def test_default_startup_initialises_every_persistable():
    main = load_program(example("small_resnet.json"))
    startup, added = default_startup(main, learning_rate=0.5)
    persist = {v.name for v in main.global_block().vars.values() if v.persistable}
    assert set(added) == persist
    scope = se.Scope()
    se.Executor(se.CPUPlace()).run(startup, scope=scope)
    for op in main.global_block().ops:
        if op.type == "batch_norm":
            assert bool((scope.find_var(op.input("Scale")[0]) == 1).all())
            assert bool((scope.find_var(op.input("Variance")[0]) == 1).all())
            assert bool((scope.find_var(op.input("Bias")[0]) == 0).all())
        if "LearningRate" in op.inputs:
            assert float(scope.find_var(op.input("LearningRate")[0])) == 0.5
    w = scope.find_var(main.all_parameters()[0].name)
    assert float(w.abs().max()) > 0  # Xavier, not zeros
    # a startup program that sets some vars keeps them; the rest get defaults
    real = load_program(example("small_resnet.startup.json"))
    merged, added = default_startup(main, real)
    assert added == [] and merged == real


# --- trace -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_trace(cli, tmp_path, name):
    out = tmp_path / "trace.json"
    steps = 2
    res = cli(["trace", example(name), "-o", out, "--places", PLACES, "--steps", steps,
               "--batch", 4, "--warmup", 1])
    assert res.status == 0, res
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    g = graph_of(name)
    slices = [e for e in events if e["ph"] == "X" and e["cat"] != "step"]
    assert len(slices) == len(g.ops) * steps
    per_op = collections.Counter(e["args"]["op_id"] for e in slices)
    assert per_op == {op.id: steps for op in g.ops}
    assert collections.Counter(e["args"]["step"] for e in slices) == \
        {s: len(g.ops) for s in range(1, steps + 1)}
    for e in slices:
        op = g.ops[e["args"]["op_id"]]
        assert e["name"] == op.name and e["cat"] == op.kind
        assert e["ts"] >= 0 and e["dur"] >= 0
    lanes = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"cpu:0", "cpu:1", "collectives", "fetch", "steps"} <= set(lanes.values())
    reduce_lanes = {lanes[e["pid"]] for e in slices if e["cat"] == "all_reduce"}
    assert reduce_lanes == {"collectives"}
    compute = {lanes[e["pid"]] for e in slices if e["cat"] == "compute"}
    assert compute == {"cpu:0", "cpu:1"}
    named = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and
             e["name"] == "thread_name"}
    assert {(e["pid"], e["tid"]) for e in slices} <= named
    assert len([e for e in events if e.get("cat") == "step"]) == steps
    assert len(losses_of(res.out)) == steps


# --- convert -----------------------------------------------------------------------------------

def test_convert_round_trip(cli, tmp_path):
    text = tmp_path / "seed.ssa"
    res = cli(["convert", example("seed_mlp.json"), text])
    assert res.status == 0, res
    assert (tmp_path / "seed.startup.ssa").is_file() and "startup program" in res.out
    assert load_program(text) == load_program(example("seed_mlp.json"))
    back = tmp_path / "seed.json"
    res = cli(["convert", text, back])
    assert res.status == 0, res
    assert back.read_text() == example("seed_mlp.json").read_text()
    assert (tmp_path / "seed.startup.json").read_text() == \
        example("seed_mlp.startup.json").read_text()
    res = cli(["convert", example("uci_housing.json"), tmp_path / "u.yaml"])
    assert_clean_error(res, "u.yaml", "unknown program file suffix")


def test_examples_are_up_to_date(tmp_path):
    sys.path.insert(0, str(EXAMPLES_DIR))
    try:
        import make_examples
    finally:
        sys.path.remove(str(EXAMPLES_DIR))
    for path in make_examples.write(tmp_path, names=["uci_housing", "seed_mlp", "mnist_mlp"]):
        assert path.read_text() == (EXAMPLES_DIR / path.name).read_text(), path.name


# --- errors and help ---------------------------------------------------------------------------

BAD_JSON = '{"schema": "ssaexec.program",\n "version": 1,,\n}\n'
BAD_TEXT = "ssaexec-program v1 random_seed=0\n\nblock 0 parent=-1 {\n  var x : float32[-1, 13] " \
           "data\n  y = mul(X=x, Y=\n}\n"


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "syntax.json").write_text(BAD_JSON)
    (d / "syntax.ssa").write_text(BAD_TEXT)
    text = example("uci_housing.ssa").read_text()
    assert "Y=fc_0.w_0)" in text
    (d / "invalid.ssa").write_text(text.replace("Y=fc_0.w_0)", "Y=nope_w)", 1))
    return d


ERRORS = {  # kind -> (file, message parts)
    "missing": ("missing.json", ["missing.json: no such program file"]),
    "json-syntax": ("syntax.json", ["syntax.json:2:15: invalid JSON"]),
    "text-syntax": ("syntax.ssa", ["syntax.ssa:6:1: expected"]),
    "invalid": ("invalid.ssa", ["invalid.ssa: invalid program: block 0, op 0 (mul)", "nope_w"]),
    "suffix": ("program.yaml", ["program.yaml: unknown program file suffix"]),
}
COMMANDS = {
    "dump": [], "viz": ["-o", "{tmp}/x.svg"], "stats": [], "run": ["--places", PLACES],
    "trace": ["-o", "{tmp}/t.json", "--places", PLACES], "convert": ["{tmp}/out.json"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("kind", list(ERRORS))
def test_file_errors_exit_2_with_location(cli, bad_files, tmp_path, command, kind):
    fname, needles = ERRORS[kind]
    extra = [a.replace("{tmp}", str(tmp_path)) for a in COMMANDS[command]]
    res = cli([command, bad_files / fname, *extra])
    assert_clean_error(res, *needles)
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("argv, needles", [
    (["stats", "{ex}", "--places", "cpu:0"], ["--places cpu:0"]),
    (["dump", "{ex}", "--places", "tpu:3"], ["bad places 'tpu:3'"]),
    (["viz", "{ex}", "-o", "{tmp}/x.gif"], ["x.gif: cannot draw a gif file"]),
    (["dump", "{ex}", "--block", "fwd"], ["unknown section 'fwd'"]),
    (["dump", "{ex}", "--filter", "("], ["bad --filter pattern"]),
    (["dump", "{ex}", "--fetch", "nope"], ["--fetch 'nope'"]),
    (["run", "{ex}", "--feed", "{tmp}/none.npz", "--places", PLACES], ["none.npz: no such feed"]),
    (["run", "{ex}", "--places", PLACES, "--batch", "1"], ["batch 1 is smaller than the 2"]),
    (["run", "{ex}", "--places", PLACES, "--loss", "nope"], ["--loss 'nope'"]),
    (["run", "{ex}", "--startup", "{tmp}/nope.json"], ["nope.json: no such program file"]),
    (["dump", "{ex}", "-o", "{tmp}/no/such/dir/x.txt"], ["cannot write"]),
])
def test_argument_errors_exit_2(cli, tmp_path, argv, needles):
    argv = [a.replace("{ex}", str(example("seed_mlp.json"))).replace("{tmp}", str(tmp_path))
            for a in argv]
    assert_clean_error(cli(argv), *needles)


def test_usage_errors_exit_2(cli):
    for argv in ([], ["dump"], ["frobnicate"], ["run", "x.json", "--steps", "0"]):
        res = cli(argv)
        assert res.status == 2 and "usage: ssaexec" in res.err and "Traceback" not in res.err


def test_debug_shows_the_traceback(cli, bad_files):
    res = cli(["--debug", "stats", bad_files / "syntax.json"])
    assert res.status == 2 and "Traceback" in res.err and "ProgramError" in res.err
    res = cli(["stats", bad_files / "syntax.json", "--debug"])
    assert res.status == 2 and "Traceback" in res.err


def test_help_everywhere(cli):
    res = cli(["--help"])
    assert res.status == 0 and "examples:" in res.out
    for command in COMMANDS:
        assert command in res.out
        res_c = cli([command, "--help"])
        assert res_c.status == 0, res_c
        assert "examples:" in res_c.out and f"ssaexec {command}" in res_c.out


def test_console_script_is_a_real_process(tmp_path):
    # (python -m ssaexec runs for real in test_viz_png_with_no_dot_on_path)
    script = Path(sys.executable).with_name("ssaexec")
    if not script.exists():
        pytest.skip("the ssaexec console script is not installed next to the interpreter")
    proc = subprocess.run([str(script), "dump", str(tmp_path / "missing.json")],
                          capture_output=True, text=True, timeout=CALL_TIMEOUT, env=_env())
    assert_clean_error(Result(proc.returncode, proc.stdout, proc.stderr),
                       "missing.json: no such program file")


def test_progress_bar():
    import io

    class Tty(io.StringIO):
        def isatty(self):
            return True

    s = Tty()
    bar = ProgressBar(4, stream=s)
    bar.update(2, "loss 1.0")
    assert "[" + "#" * 14 + "." * 14 + "] 2/4 loss 1.0" in s.getvalue()
    bar.clear()
    assert s.getvalue().endswith("\r\x1b[K")
    quiet = io.StringIO()
    ProgressBar(4, stream=quiet).update(1)
    ProgressBar(4, stream=Tty(), enabled=False).update(1)
    assert quiet.getvalue() == ""


def test_long_edges_are_cut_on_big_graphs():
    from ssaexec.graph.draw import SPLIT_SPAN, drawn_graph
    g = graph_of("small_resnet.json")
    whole = drawn_graph(g, split=False)
    cut = drawn_graph(g)  # big: cut by default
    ops = {f"op:{op.id}" for op in g.ops}
    assert ops <= set(cut.nodes) and ops <= set(whole.nodes)
    kinds = collections.Counter(d["kind"] for _, d in cut.nodes(data=True))
    assert kinds["ref"] > 0 and kinds["after"] > 0
    for node, d in cut.nodes(data=True):
        if d["kind"] in ("ref", "after"):  # a copy stands for a node of the whole graph
            assert d["of"] in whole.nodes and cut.out_degree(node) == 1
    lv = whole.nodes
    assert max(lv[v]["level"] - lv[u]["level"] for u, v in whole.edges) > SPLIT_SPAN
    small = drawn_graph(graph_of("seed_mlp.json"))
    assert not any(d["kind"] in ("ref", "after") for _, d in small.nodes(data=True))


def test_run_saves_and_resumes_a_checkpoint_with_the_training_strategies(cli, tmp_path):
    ckpt = tmp_path / "run.safetensors"
    first = cli(["run", example("mnist_mlp.json"), "--places", PLACES, "--steps", 4,
                 "--batch", 8, "--amp", "bf16", "--accumulate", 2, "--save", str(ckpt),
                 "--no-progress"])
    assert first.status == 0, first
    losses = losses_of(first.out)
    assert losses[0] == losses[1] and losses[2] < losses[1]  # an update every 2nd run
    assert f"checkpoint: {ckpt}" in first.out and "collective backend: local" in first.out
    again = cli(["run", example("mnist_mlp.json"), "--places", "cpu:1", "--steps", 2,
                 "--batch", 8, "--resume", str(ckpt), "--no-progress"])
    assert again.status == 0, again
    assert f"parameters: {ckpt} (checkpoint after 4 runs)" in again.out, again
    assert losses_of(again.out)[0] < losses[0]  # it starts from the trained values
    missing = cli(["run", example("mnist_mlp.json"), "--steps", 1, "--resume",
                   str(tmp_path / "none.safetensors")])
    assert missing.status != 0 and "no such checkpoint" in missing.err, missing


def test_run_saves_a_sharded_checkpoint_under_zero_and_exports_dcp(cli, tmp_path):
    ckpt, out = tmp_path / "run.safetensors", tmp_path / "run.dcp"
    first = cli(["run", example("mnist_mlp.json"), "--places", "cpu:2", "--zero", 2,
                 "--steps", 2, "--batch", 8, "--save", str(ckpt), "--export-dcp", str(out),
                 "--no-progress"])
    assert first.status == 0, first
    names = sorted(os.listdir(tmp_path))
    assert names[:2] == ["run.dcp", "run.safetensors"] and len(names) == 3
    assert re.fullmatch(r"run\.shard-00001-of-00002-[0-9a-f]{16}\.safetensors", names[2])
    assert sorted(os.listdir(out)) == [".metadata", "__0_0.distcp"]
    again = cli(["run", example("mnist_mlp.json"), "--places", "cpu:1", "--steps", 1,
                 "--batch", 8, "--resume", str(ckpt), "--no-progress"])
    assert again.status == 0 and "(checkpoint after 2 runs)" in again.out, again
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("")
    refused = cli(["run", example("mnist_mlp.json"), "--steps", 1, "--export-dcp",
                   str(tmp_path / "mine")])
    assert refused.status == 2 and "a folder that is not a DCP export" in refused.err \
        and "nothing was trained" in refused.err and "step" not in refused.out, refused


def test_stats_says_whether_the_step_can_be_captured_as_a_cuda_graph(cli, tmp_path):
    res = cli(["stats", example("mnist_mlp.json"), "--places", "2"])
    assert res.status == 0 and "cuda graph: the step can be captured" in res.out, res
    import ssaexec as se
    main, startup = se.Program(), se.Program()
    with se.program_guard(main, startup):
        h = se.layers.dropout(se.layers.fc(se.layers.data("x", [-1, 4]), 4), 0.5)
        se.optimizer.SGD(0.1).minimize(se.layers.mean(h))
    path = tmp_path / "drop.json"
    se.save_program(main, str(path))
    res = cli(["stats", str(path), "--format", "json"])
    assert res.status == 0, res
    cg = json.loads(res.out)["cuda_graph"]
    assert not cg["capturable"] and "dropout" in cg["why_not"]


def test_stats_says_what_the_compiler_would_run_uncompiled(cli, tmp_path, monkeypatch):
    res = cli(["stats", example("mnist_mlp.json"), "--places", "1", "--compiler", "inductor"])
    assert res.status == 0, res
    # the commit phase is a segment of its own under the compiler (atomic steps); its
    # momentum updates run as foreach calls (runtime.inductor.FOREACH_UPDATES)
    assert "compiler        inductor: 2 segments (1 in the commit phase), 1 to run " \
        "uncompiled" in res.out, res.out
    assert "uncompiled    cpu:0 segment 2 (segment(6 ops from momentum#" in res.out
    assert "its updates (momentum) run as fused foreach calls" in res.out
    monkeypatch.setenv("SSAEXEC_INDUCTOR_FOREACH", "0")  # compile those too
    res = cli(["stats", example("mnist_mlp.json"), "--places", "1", "--compiler", "inductor"])
    assert "2 segments (1 in the commit phase), 0 to run uncompiled" in res.out, res.out
    import ssaexec as se
    from tests.ops.test_control import _program
    path = tmp_path / "cond.json"
    se.save_program(_program(), str(path))
    res = cli(["stats", str(path), "--places", "1", "--compiler", "inductor", "--format",
               "json"])
    assert res.status == 0, res
    comp = json.loads(res.out)["compiler"]
    assert [u["why"] for u in comp["uncompiled"]] == [
        "conditional_block#1@cpu:0 is a control op (its sub-blocks run on the scheduler)"]


def test_compiler_option_offers_auto_and_says_the_default(cli):
    """issue 50: --compiler names every compiler (auto, the library's default, included)
    and says which one runs when none is named."""
    from argparse import Namespace

    from ssaexec.cli.execute import compiler_of
    from ssaexec.core.strategy import DEFAULT_COMPILER
    res = cli(["run", "--help"])
    assert res.status == 0 and "{default,auto,inductor,none}" in res.out, res.out
    flat = " ".join(res.out.split())
    assert f"(default: ExecutionStrategy's, {DEFAULT_COMPILER or 'none'};" in flat
    res = cli(["trace", "--help"])
    assert "(default: none;" in " ".join(res.out.split()), res.out  # the per-op view
    # "none" is compiler=None; the others are passed on as they are
    assert compiler_of(Namespace(compiler="none")) is None
    assert compiler_of(Namespace(compiler="default")) == "default"
    assert compiler_of(Namespace(compiler="auto")) == "auto"
    res = cli(["run", example("mnist_mlp.json"), "--places", "cpu:1", "--steps", 1,
               "--compiler", "none"])
    assert res.status == 0, res
    res = cli(["run", example("mnist_mlp.json"), "--compiler", "jit"])
    assert res.status == 2 and "invalid choice: 'jit'" in res.err
    # stats: auto compiles the Inductor runner's segments, in the background
    res = cli(["stats", example("mnist_mlp.json"), "--places", "1", "--compiler", "auto"])
    assert res.status == 0, res
    assert "compiler        auto: 2 segments (1 in the commit phase)" in res.out, res.out
