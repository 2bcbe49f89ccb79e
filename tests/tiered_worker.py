"""One process of the multi-process tiered compilation test
(tests/dist/test_tiered_processes.py starts two, with ``zero_worker``'s environment; run as
``python tests/tiered_worker.py OUT_DIR``).

Each rank trains the small Adam MLP of ``tests/runtime/test_tiered.py`` (float32) on its
half of the same global batches, twice: with ``compiler="auto"`` and with ``compiler=None``
(the oracle). Under "auto", a cold compile is submitted at step 3, after the first
agreement (start of step 3) found no rank ready; rank 0 waits for its compiles after
step 3 and rank 1 after step 4: both are ready at the second agreement, ``AGREE_EVERY``
steps later and read a step after, and must switch at that same step. A warm launch
submits its loads at step 2 and switches at the first agreement. Last, an evaluation program (no collective: a rank could run it alone) under
"auto" runs the compiled path. Each rank writes ``OUT_DIR/rank<r>.pt``: the switches, the
steps each tier ran, the parameters of both runs and what the evaluation runner is.
"""

import os
import sys

import torch

from ssaexec.runtime.tiered import AGREE_EVERY

TESTS = os.path.dirname(os.path.abspath(__file__))
# the first agreement, the next (AGREE_EVERY later, read a step later), 4 compiled steps
# after it (the switch's line is said after 3)
STEPS = 2 + AGREE_EVERY + 1 + 4


def train(se, compiler, feeds, rank):
    sys.path.insert(0, TESTS)
    from runtime.test_tiered import _mlp
    main, startup, loss = _mlp("float32")
    scope = se.Scope()
    torch.manual_seed(1)
    se.Executor(se.CPUPlace(0)).run(startup, scope=scope)
    run = se.ExecutionStrategy(compiler=compiler)
    with se.ParallelExecutor(se.distributed.local_places(1), main, startup, loss.name,
                             se.distributed.build_strategy(), run, scope=scope) as pe:
        for i, feed in enumerate(feeds):
            pe.run([loss], feed=se.distributed.shard_batch(feed))
            # a cold compile is submitted at step 3 (step 2 is the first measured for
            # runtime.tiered.compile_beside): rank 0 waits for it after step 3, rank 1
            # after step 4; a warm load (submitted at step 2) is waited for at the first
            # agreement anyway
            if compiler == "auto" and i == 2 + rank:
                assert pe._runner((loss.name,)).lowering.wait(timeout=300)
        runner = pe._runner((loss.name,))
    params = {p.name: scope.find_var(p.name).clone() for p in main.all_parameters()}
    return params, runner, (main, startup, loss, scope)


def main(out_dir):
    from ssaexec.harness.worker import die_with_parent
    die_with_parent()
    import ssaexec as se
    from ssaexec.runtime.tiered import TieredRunner
    info = se.distributed.init(backend="gloo", timeout=120)
    gen = torch.Generator().manual_seed(0)
    feeds = [{"x": torch.randn(8, 6, generator=gen), "y": torch.randn(8, 1, generator=gen)}
             for _ in range(STEPS)]
    params, runner, (main, startup, loss, scope) = train(se, "auto", feeds, info.rank)
    low = runner.lowering
    record = {"switches": [s for s, _ in low.switches], "ran": dict(low.ran),
              "tiered": isinstance(runner, TieredRunner), "params": params,
              "reference": train(se, None, feeds, info.rank)[0]}
    # an evaluation: no collective in its graph, so nothing to agree its tier through (a
    # rank may run its steps alone)
    test = main.clone(for_test=True)
    with se.ParallelExecutor(se.distributed.local_places(1), test, startup, loss.name,
                             se.distributed.build_strategy(),
                             se.ExecutionStrategy(compiler="auto"), scope=scope) as pe:
        pe.run([loss], feed=se.distributed.shard_batch(feeds[0]))
        runner = pe._runner((loss.name,))
        record["eval_tiered"] = isinstance(runner, TieredRunner)
        record["eval_compiled"] = runner.lowering.compiled
    torch.save(record, os.path.join(out_dir, f"rank{info.rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
