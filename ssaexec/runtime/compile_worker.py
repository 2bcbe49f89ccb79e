"""The compile worker: a process that compiles traced segments into Inductor's on-disk cache.

Tiered compilation (``runtime.tiered``) must not stall the training thread. Inductor's
compile is mostly Python: in a thread of the training process it holds the interpreter
lock, and on 2 shared cores a small MLP's steps ran 2.3x slower for the whole compile
(0.67 ms a step alone). So the trace
(a fraction of the compile, and it needs the step's own code and values) runs in a thread
of the training process, and the compile runs here, in a process of its own:

1. the training process sends the traced fx graph (pickled over this process's stdin: a
   pipe only the two processes hold), its example inputs' shapes, strides, dtypes and
   devices, torch's thread count as the thread that will load the graph sees it
   (Inductor's CPU kernels, and so its cache key, follow that count),
   ``compile_graph``'s ``split_build`` and the ``TORCHINDUCTOR_CACHE_DIR`` it loads from;
2. this process compiles it with the very call the training process uses
   (``inductor.compile_graph``), on empty tensors of that layout (a compile reads no
   values), which writes the compiled graph into Inductor's FX graph cache (that
   directory), and answers (ok, or the error's first line);
   before that, a word as its C++ build starts (``compat.on_cpp_build``), on which the
   training process imports what its load will need;
3. the training process compiles the same graph again, which loads it from that cache
   (a cache hit: no kernel is generated or compiled again).

The training process starts the worker ahead of its first graph (``start``: at the model's
import, ``runtime.tiered.prestart``, or at the step that submits the first compile): the
worker's imports and its check of the CPU's vector ISA (``compat.vec_isa_first``: C++
test programs; seconds in all) run while the training process builds its program or traces,
not after. Nothing the worker does before its first graph depends on the training
process's state at its start (the thread count and the cache directory come with each
graph).

If anything goes wrong here (the process cannot start, dies, or the graph does not
pickle), the caller compiles in its own thread as if this process did not exist: a slower
background compile, never a failed step. The process reads until its stdin closes (the
training process exits or closes it) and then exits.
"""

import atexit
import os
import pickle
import subprocess
import sys
import threading

__all__ = ["CompileWorker", "main", "portable"]


NICE = 19  # the worker's scheduling priority, lowest (see _ENTRY)
# The training process first: on a busy machine the worker (and the C++ compilers it
# starts, which inherit its priority) takes the cycles left over, so the running steps
# lose as little as they can; on idle cores it changes nothing. Its priority is lowered
# before anything is imported: its imports (torch, this package, Inductor: seconds of CPU)
# at the normal priority made a small MLP's steps 2-3x slower for their 2-4 s on 2 loaded
# cores, and within the noise once lowered first (bench50.md)
_ENTRY = ("import os\n"
          "try:\n"
          f"    os.nice({NICE})\n"
          "except (AttributeError, OSError):\n"
          "    pass\n"
          "from ssaexec.runtime.compile_worker import main\n"
          "main()")


def _frame(stream, payload):
    stream.write(len(payload).to_bytes(8, "little"))
    stream.write(payload)
    stream.flush()


def _read(stream):
    head = stream.read(8)
    if len(head) < 8:
        return None
    n = int.from_bytes(head, "little")
    data = stream.read(n)
    if len(data) < n:
        return None
    return data


def portable(gm):
    """``gm`` as the worker sees it: pickled and unpickled. fx traces an unpickled graph
    module again from its code, which drops dead code, so the graph differs from ``gm``
    and so does its cache key; one round trip gives the graph every process compiles
    (the worker, and the training process loading it from the cache, now or in a later
    run)."""
    return pickle.loads(pickle.dumps(gm))


class CompileWorker:
    """The training process's handle on its compile worker, started at the first use.

    ``compile(gm, example_inputs)`` returns None once the worker has compiled the graph
    into the cache, else why not (the caller then compiles it itself). ``gm`` must be a
    ``portable`` graph: only the same graph makes the same cache key."""

    def __init__(self):
        self.proc = None
        self.lock = threading.Lock()  # one request at a time on the pipe
        self.broken = None  # why the worker is not used any more

    def start(self):
        """Start the worker now, if it is not running: it imports Inductor and checks the
        CPU's vector ISA (seconds) while the training process traces its first graph."""
        with self.lock:
            if self.broken is None:
                try:
                    self._process()
                except Exception as e:  # noqa: BLE001 - compile() says it, and falls back
                    self.broken = f"the compile worker failed ({type(e).__name__}: {e})"

    def compile(self, gm, example_inputs, split_build=False, building=None):
        """Have the worker compile ``gm`` (``inductor.compile_graph`` with ``split_build``);
        None once it has, else why not. ``building()`` runs here as the worker's C++ build
        starts (its Python lowering done: seconds before its answer); it handles its own
        errors."""
        with self.lock:
            if self.broken is not None:
                return self.broken
            try:
                metas = [(tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device))
                         for t in example_inputs]
                # read in the thread that loads the graph afterwards: the count its key has
                import torch
                # and Inductor's cache directory as this process sees it now (the load's)
                cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
                payload = pickle.dumps((gm, metas, torch.get_num_threads(), split_build, cache))
                proc = self._process()
                _frame(proc.stdin, payload)
                while True:
                    reply = _read(proc.stdout)
                    if reply is None:
                        raise OSError(f"the compile worker exited (status {proc.wait()})")
                    ok, why = pickle.loads(reply)
                    if ok is not None:
                        break
                    if building is not None:  # (None, "building"): the C++ build begins
                        building()
            except Exception as e:  # noqa: BLE001 - any failure: the caller compiles itself
                self.broken = f"the compile worker failed ({type(e).__name__}: {e})"
                self.close()
                return self.broken
            return None if ok else why

    def _process(self):
        if self.proc is None:
            env = dict(os.environ)
            # the worker imports this very ssaexec and torch
            env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
            self.proc = subprocess.Popen([sys.executable, "-c", _ENTRY],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         env=env)
            atexit.register(self.close)  # (runtime.tiered closes it earlier)
        return self.proc

    def close(self):
        """Close the worker's stdin, so that an idle worker exits; one still compiling is
        stopped (a run that ends before its compiles does not wait for them)."""
        self.broken = self.broken or "the compile worker is closed"  # and stays closed
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=0.5)
        except Exception:  # noqa: BLE001 - busy: stopped (SIGTERM, then SIGKILL)
            proc.terminate()
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()


def main():
    """The worker's loop: read a graph, compile it, answer; until stdin closes."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever Inductor prints goes to stderr, not into the answers
    # (its priority was lowered first thing: _ENTRY)
    import torch

    from ..core import compat
    from .inductor import compile_graph
    compat.require("inductor.compile_fx")  # imported before the first graph arrives
    # and the CPU vector ISA checked (seconds of C++ builds), as soon as the worker starts:
    # the training process starts it before its trace (``CompileWorker.start``). Done on a
    # machine with CUDA too, where its graphs may not need it: seconds of a spare core, at
    # the lowest priority
    compat.vec_isa_first()

    inp = sys.stdin.buffer
    while (data := _read(inp)) is not None:
        try:
            gm, metas, threads, split_build, cache = pickle.loads(data)
            # the cache the training process loads from (Inductor reads it at each compile)
            if cache is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
            # Inductor's CPU kernels (and its cache key) follow torch's thread count: the
            # loading thread's, sent with the graph
            torch.set_num_threads(threads)
            examples = [torch.empty_strided(shape, stride, dtype=dtype, device=device)
                        for shape, stride, dtype, device in metas]
            # a word as the C++ build starts: the training process then readies its load
            with compat.on_cpp_build(lambda: _frame(out, pickle.dumps((None, "building")))):
                compile_graph(gm, examples, split_build)
            reply = (True, "")
        except Exception as e:  # noqa: BLE001 - answered, and the caller compiles itself
            text = str(e).strip().splitlines()
            reply = (False, f"{type(e).__name__}: {text[0][:200] if text else ''}")
        try:
            _frame(out, pickle.dumps(reply))
        except OSError:  # the training process is gone (its end closed the pipe)
            return

