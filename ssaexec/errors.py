"""The ssaexec exception hierarchy.

Every error a user can provoke is one of these, each naming what is wrong and
where (block, op index, op type, var, place, file line and column), with a hint
when one helps. Raw tracebacks are for bugs in ssaexec itself.
"""

__all__ = ["SSAExecError", "ProgramError", "OpError", "FeedError", "GraphError",
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


class FeedError(SSAExecError):
    """A feed does not match the program's data variables."""


class GraphError(SSAExecError):
    """An SSA graph broke one of its invariants (see ``SSAGraph.lint``)."""


class DistributedError(SSAExecError):
    """A multi-process run failed: a peer died, timed out or disagreed."""
