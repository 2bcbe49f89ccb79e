"""bench/places_scaling.py: its argument checks, and its paired ways on the tests' tiny
MLP (one round; the figures are not checked, only that every way ran and the executor's
rule said what it kept)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("places_scaling",
                                                  ROOT / "bench" / "places_scaling.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("argv, says", [
    (["--models", "gpt-5"], "unknown model 'gpt-5'"),
    (["--models", ","], "unknown model '(none)'"),
    (["--compilers", "tvm"], "unknown compiler 'tvm'"),
    (["--rounds", "0"], "--rounds must be at least 1"),
])
def test_bad_arguments_are_refused_before_anything_runs(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        _module().main(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err


def test_the_ways_run_paired_and_the_rule_says_what_it_kept():
    r = _module().ways("tiny", None, rounds=1)
    assert set(r["median"]) == {"1 place", "2 places", "2 threads", "2 turns"}
    assert all(v > 0 for v in r["median"].values())
    assert r["choice"]["mode"] in ("threads", "turns") and r["choice"]["reason"]
