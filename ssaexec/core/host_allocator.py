"""glibc's malloc keeps the memory a step frees, for the next step (CPU places).

torch allocates a CPU tensor's storage with the C library's ``malloc``. glibc's defaults
return freed memory to the kernel eagerly: a block above the mmap threshold (128 KiB at
first, raised as blocks are freed) is unmapped on ``free``, and the top of a thread's heap
is given back once it exceeds the trim threshold. A training step frees its activations
and gradients and allocates the same sizes again in the next step, so each step touched
freshly mapped pages again: the kernel zeroed every page on first touch. On the quick
ResNet-18's 2 CPU places (the straight-line tier, 2 cores) that was about 16,000 page
faults a step and 0.71x the images/sec (``bench/places_scaling.py``, docs/benchmarks.md).
A GPU caching allocator keeps freed blocks for the same reason.

Policy. The first executor with a CPU place (``ParallelExecutor``, ``Executor``) calls
``keep_freed_memory`` once per process, which sets glibc's ``M_MMAP_THRESHOLD`` to its
largest value (32 MiB on 64-bit: smaller blocks come from the heaps, and stay there when
freed) and ``M_TRIM_THRESHOLD`` to ``TRIM_BYTES`` (a heap keeps up to that much free memory
at its top). The cost is memory: the process's resident size stays at its high-water mark
(per malloc arena, up to ``TRIM_BYTES`` of it free) instead of shrinking between steps.

Left alone (``decide`` says why, ``state`` says what was done):

* ``SSAEXEC_HOST_ALLOCATOR=system`` (the default is ``keep``; any other value is an error
  that names both);
* the user's own malloc settings: ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``,
  ``MALLOC_TOP_PAD_``, ``MALLOC_MMAP_MAX_``, or ``glibc.malloc.`` in ``GLIBC_TUNABLES``;
* another allocator preloaded (``LD_PRELOAD`` naming jemalloc, tcmalloc or mimalloc), or a
  C library that is not glibc (then there is no ``mallopt`` to call).

Results never depend on it: only where the allocator finds memory changes.
"""

import ctypes
import os
import platform

from .errors import SSAExecError

__all__ = ["ENV", "TRIM_BYTES", "decide", "keep_freed_memory", "state"]

ENV = "SSAEXEC_HOST_ALLOCATOR"
_CHOICES = ("keep", "system")
TRIM_BYTES = 1 << 30  # free memory a heap keeps at its top: a step's temporaries, with room
_MMAP_BYTES = 32 << 20  # glibc's largest mmap threshold on 64-bit (HEAP_MAX_SIZE / 2)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # <malloc.h>
_USER_MALLOC = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                "MALLOC_MMAP_MAX_")
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
_state = None  # what keep_freed_memory did in this process (None: not called yet)


def decide(env, libc):
    """Why glibc's malloc is left alone, or None to tune it.

    ``env``: the environment (a mapping); ``libc``: ``platform.libc_ver()[0]``.
    """
    choice = env.get(ENV, "keep").strip().lower() or "keep"
    if choice not in _CHOICES:
        raise SSAExecError(f"{ENV}={env.get(ENV)!r}: expected keep (the default: freed "
                           "memory stays with the process for the next step) or system "
                           "(the C library's own defaults)")
    if choice == "system":
        return f"{ENV}=system"
    mine = [k for k in _USER_MALLOC if k in env]
    if "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        mine.append("GLIBC_TUNABLES")
    if mine:
        return f"the environment sets malloc's own options ({', '.join(mine)})"
    preload = env.get("LD_PRELOAD", "")
    other = [a for a in _OTHER_ALLOCATORS if a in preload]
    if other:
        return f"LD_PRELOAD brings another allocator ({other[0]})"
    if libc != "glibc":
        return f"the C library is {libc or 'unknown'}, not glibc"
    return None


def keep_freed_memory():
    """Tune glibc's malloc for repeated steps, once per process (see the module's policy).

    Returns ``state()``.
    """
    global _state
    if _state is not None:
        return _state
    reason = decide(os.environ, platform.libc_ver()[0])
    if reason is not None:
        _state = {"kept": False, "reason": reason}
        return _state
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        _state = {"kept": False, "reason": "this process has no mallopt"}
        return _state
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success; glibc refuses a value out of its range with 0
    ok = mallopt(_M_MMAP_THRESHOLD, _MMAP_BYTES) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES) == 1 and ok
    _state = {"kept": ok, "reason": None if ok else "glibc refused the thresholds",
              "mmap_threshold": _MMAP_BYTES, "trim_threshold": TRIM_BYTES}
    return _state


def state():
    """What ``keep_freed_memory`` did in this process (None: not called yet): ``kept``,
    and ``reason`` when it did not."""
    return None if _state is None else dict(_state)
