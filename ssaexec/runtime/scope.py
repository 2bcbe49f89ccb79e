"""Scopes: name -> tensor maps that hold a program's values between ops and runs.

A scope may have a parent; lookups fall back to it, writes stay local. The
``ParallelExecutor`` keeps one scope per place. Plain dict operations are
atomic under the GIL, which is all the scheduler needs: the SSA graph already
orders every write against the reads of the same name.

Stamps. ``version`` is a number no other scope has had: ``set_var`` and ``touch``
(called by the executors when a step ends) renew it, so an executor can tell that
someone wrote a scope since its last step and check the values its program will read
against their declarations (``runtime.boundary``). Writing ``vars`` directly (the
runtime's own bookkeeping inside a step) leaves the stamp alone.
"""

__all__ = ["Scope", "global_scope", "scope_guard"]

import contextlib
import itertools

# next() of a count is atomic in CPython: stamps stay unique across threads
_STAMPS = itertools.count(1)


class Scope:
    """A map from var name to ``torch.Tensor`` with an optional parent scope."""

    __slots__ = ("vars", "parent", "version", "__weakref__")

    def __init__(self, parent=None):
        self.vars = {}
        self.parent = parent
        self.version = next(_STAMPS)

    def find_var(self, name):
        """The tensor named ``name`` here or in an ancestor, else None."""
        scope = self
        while scope is not None:
            t = scope.vars.get(name)
            if t is not None:
                return t
            scope = scope.parent
        return None

    def set_var(self, name, tensor):
        """Bind ``name`` to ``tensor`` in this scope (renews the stamp)."""
        self.vars[name] = tensor
        self.version = next(_STAMPS)

    def touch(self):
        """Renew the stamp: the values may have changed (a step ran in this scope)."""
        self.version = next(_STAMPS)

    def has_var(self, name):
        return self.find_var(name) is not None

    def erase(self, name):
        """Drop ``name`` from this scope (no error if absent)."""
        self.vars.pop(name, None)

    def var_names(self):
        """Names bound in this scope (not its ancestors)."""
        return list(self.vars)

    def new_scope(self):
        """A child scope whose lookups fall back to this one."""
        return Scope(self)

    def __contains__(self, name):
        return self.has_var(name)

    def __repr__(self):
        return f"<Scope vars={len(self.vars)}>"


_global = [Scope()]


def global_scope():
    """The default scope of ``Executor.run``."""
    return _global[-1]


@contextlib.contextmanager
def scope_guard(scope):
    """Make ``scope`` the global scope within the block."""
    _global.append(scope)
    try:
        yield scope
    finally:
        _global.pop()
