"""The ssaexec exception hierarchy.

Every error a user can provoke is one of these, each naming what is wrong and
where (block, op index, op type, var, place, file line and column), with a hint
when one helps. Raw tracebacks are for bugs in ssaexec itself.
"""

__all__ = ["SSAExecError", "ProgramError", "OpError", "CommitError", "FeedError", "GraphError",
           "DistributedError"]


class SSAExecError(Exception):
    """Base class of every error ssaexec raises on purpose."""


class ProgramError(SSAExecError):
    """A program description (built, loaded or imported) is invalid or malformed."""


class OpError(SSAExecError):
    """An operator failed at run time; the original exception is chained."""

    def __init__(self, message, op_type=None, place=None, input_shapes=None):
        super().__init__(message)
        self.op_type = op_type
        self.place = place
        self.input_shapes = input_shapes


class CommitError(OpError):
    """An op failed in a step's commit phase, after in-place updates had begun.

    The one failure a step cannot undo (``graph.commit``): places may differ, so
    restore them from a checkpoint. The original exception is chained.
    """

    @classmethod
    def of(cls, err):
        """The ``CommitError`` for ``err`` (an ``OpError`` keeps its fields)."""
        msg = (f"{err}\nThe step failed in its commit phase, after in-place updates of "
               "persistable state had begun: places may now differ. Restore them from a "
               "checkpoint (ssaexec.save_checkpoint / load_checkpoint).")
        if isinstance(err, OpError):
            return cls(msg, err.op_type, err.place, err.input_shapes)
        return cls(msg)


class FeedError(SSAExecError):
    """A feed does not match the program's data variables."""


class GraphError(SSAExecError):
    """An SSA graph broke one of its invariants (see ``SSAGraph.lint``)."""


class DistributedError(SSAExecError):
    """A multi-process run failed: a peer died, timed out or disagreed."""
