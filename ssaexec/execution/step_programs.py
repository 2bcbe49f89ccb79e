"""The programs a ``ParallelExecutor`` step runs, per phase, derived from its main program.

A full step ("apply") runs ``main_program`` rewritten for ``ExecutionStrategy(amp=...)``
(``program.amp``); with ``BuildStrategy(gradient_accumulation_steps=K > 1)`` the micro-
batches that only accumulate gradients run a second program ("accumulate", else None)
and "apply" is the last micro-batch's (``program.accumulate``). Under ZeRO
(``BuildStrategy(zero_stage>0)`` over W > 1 ranks) "apply" is then sharded
(``program.shard.shard_program``) and "accumulate" holds the same shards
(``shard_like``); ``plain`` keeps the unsharded "apply" (what ``gathered_state``
and checkpoints declare) and ``layout`` the ``ShardLayout`` (None without ZeRO).

Invariant: the derived programs are rebuilt exactly when their key changes (the main
program's version, ``amp``, ``amp_allreduce``, K, the ZeRO stage and world), read from the strategies at each call
so a strategy changed between steps is followed; the data vars some op reads are
likewise cached per program version (computed once per version, not per step).
"""

__all__ = ["StepPrograms"]


class StepPrograms:
    """Cache of one executor's per-phase programs and of the data vars its program reads."""

    __slots__ = ("_key", "_programs", "_data_key", "_data_read")

    def __init__(self):
        self._key = self._programs = None
        self._data_key = self._data_read = None

    def program_for(self, program, phase, exec_strategy, accumulation_steps, zero=(0, 1)):
        """The program of ``phase`` ("apply", "accumulate", "plain": the full step's
        before ZeRO's sharding, or "layout": the ``ShardLayout`` or None) for
        ``program``; ``zero`` is ``(zero_stage, world)``."""
        st, k = exec_strategy, accumulation_steps
        key = (program._version, st.amp, st.amp_allreduce, k, tuple(zero))
        if self._programs is None or self._key != key:
            prog = program
            if st.amp is not None:
                from ..program.amp import amp_program
                prog = amp_program(prog, st.amp, st.amp_allreduce)
            programs = {"apply": prog, "accumulate": None}
            if k > 1:
                from ..program.accumulate import accumulation_programs
                programs["accumulate"], programs["apply"] = accumulation_programs(prog)
            programs["plain"], programs["layout"] = programs["apply"], None
            stage, world = zero
            if stage and world > 1:
                from ..program.shard import shard_like, shard_program
                programs["apply"], layout = shard_program(programs["apply"], stage, world)
                programs["layout"] = layout
                if programs["accumulate"] is not None:
                    programs["accumulate"] = shard_like(programs["accumulate"], layout)
            self._key, self._programs = key, programs
        return self._programs[phase]

    def data_read(self, program):
        """The data vars of ``program`` that some op of its global block reads."""
        key = program._version
        if self._data_read is None or self._data_key != key:
            read = {n for op in program.global_block().ops for n in op.input_names()}
            self._data_key = key
            self._data_read = [v for v in program.data_vars() if v.name in read]
        return self._data_read
