"""The executors' parts: each piece of what ``ParallelExecutor`` does, one module each.

``ParallelExecutor`` (``ssaexec.execution.parallel_executor``) is a facade: its public surface
(set-up, variables, running, observing) stays in one class, and each decision it makes
lives here, testable without an executor:

* ``runner_cache``: which runner runs a step (per fetch list, phase, path, compiler),
  built once, and the strategy its graph is built with;
* ``initial_state``: the state every place starts from (defaults of executor-added
  state, the broadcast of the persistables, each place's ZeRO shards);
* ``learning_rate``: the program's learning-rate var, and whether it may be set by hand;
* ``shared_vars``: ``share_vars_from``'s scopes and the clean-up after each step;
* ``cuda_graphs``: the executor's glue to ``runtime.cuda_graph`` (one ``StepGraphs``
  per runner);
* ``fetch_merge``: how per-place fetched values become one;
* ``torch_threads``: torch's intra-op thread count while CPU places run.

Layering: these parts import the ground layer, ``program``, ``graph`` and ``runtime``,
never an executor (``tests/execution/test_execution_parts.py`` checks it). The executors
themselves (``executor``, ``parallel_executor``) and their step helpers live here too,
above their parts.
"""
