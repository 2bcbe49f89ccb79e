"""bench/time_to_steps.py: its argument checks, refused before any process starts (the
benchmark itself is run by hand: each mode compiles in a fresh process)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("time_to_steps",
                                                  ROOT / "bench" / "time_to_steps.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("argv, says", [
    (["--modes", "ssaexec,jax"], "unknown mode(s) jax"),
    (["--modes", ","], "unknown mode(s) (none given)"),
    (["--steps", "1,ten"], "--steps must be a comma list of integers"),
    (["--steps", "0,10"], "--steps must name step counts of at least 1"),
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["--nproc", "0"], "--nproc must be at least 1"),
    (["--model", "gpt-5"], "invalid choice: 'gpt-5'"),
])
def test_bad_arguments_are_refused_before_anything_runs(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        _module().main(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err


def test_steps_are_sorted_and_each_mode_is_known():
    args = _module().parse(["--steps", "100,1,10,10", "--modes", "ssaexec-none,torch-compile"])
    assert args.steps == [1, 10, 100]
    assert args.modes == ["ssaexec-none", "torch-compile"]
    mod = _module()
    # every ssaexec mode names its compiler, every mode is one the worker can build
    assert set(mod.COMPILERS) | {"torch-compile", "torch-eager"} == set(mod.MODES)
