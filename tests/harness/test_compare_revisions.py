"""bench/compare_revisions.py: its argument checks, the lines it reads from
inductor_overhead.py's output, and the worktrees it makes (the benchmarks themselves are
run by tests/harness/test_dispatch_bench.py)."""

import importlib.util
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("compare_revisions",
                                                  ROOT / "bench" / "compare_revisions.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("argv, says", [
    (["no-such-revision"], "no such revision: 'no-such-revision'"),
    (["HEAD", "HEAD", "--rounds", "0"], "--rounds and --steps must be at least 1"),
])
def test_bad_arguments_are_refused_before_anything_runs(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        _module().main(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err


def test_it_reads_the_lines_inductor_overhead_prints():
    # the line format of bench/inductor_overhead.py's summary, as that script writes it
    source = (ROOT / "bench" / "inductor_overhead.py").read_text()
    assert 'f"  {name:18s} {ms:7.3f} ms/step  {med[\'eager\'] / ms:5.2f}x eager"' in source
    lines = [f"  {name:18s} {ms:7.3f} ms/step  {0.97 / ms:5.2f}x eager"
             for name, ms in (("eager", 0.97), ("floor", 0.31), ("ssaexec-inductor", 0.328))]
    got = {m.group(1): float(m.group(2))
           for m in map(_module().INDUCTOR_LINE.match, lines) if m}
    assert got == {"eager": 0.97, "floor": 0.31, "ssaexec-inductor": 0.328}


def test_a_worktree_holds_the_revision_and_is_removed(tmp_path):
    mod = _module()
    tree = mod.worktree("HEAD", tmp_path)
    try:
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=True).stdout
        want = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                              capture_output=True, text=True, check=True).stdout
        assert head == want and (tree / "bench" / "compare_revisions.py").is_file()
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                       check=True)
    assert not tree.exists()
