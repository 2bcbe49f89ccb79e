"""``DataLoader``: prepare the next feeds in the background while the current step runs.

A loader wraps any iterable of feed dicts (whole batches). A background thread
splits each batch across the places (as ``ParallelExecutor`` does), and for
CUDA places pins the host memory and copies it to each device on a dedicated
copy stream with ``non_blocking=True``, so input copies overlap compute, as the
parallel_do design proposes. The consumer gets a list of per-place feed dicts,
which ``ParallelExecutor.run(feed=...)`` accepts directly. At most ``prefetch``
batches wait ready; an exception in the source is re-raised in the consumer;
``close()`` (or leaving the ``with`` block, or exhausting the loader) stops the
thread.
"""

import queue
import threading

import torch

from ..core.errors import FeedError, SSAExecError

__all__ = ["DataLoader"]

_END = object()


class _Failure:
    __slots__ = ("exc",)

    def __init__(self, exc):
        self.exc = exc


def _split(t, n, name):
    from .feed import split_batch
    return split_batch(t, n, name)


class DataLoader:
    """Iterate per-place feeds prepared ``prefetch`` batches ahead.

    Parameters
    ----------
    source : iterable of dict
        Whole-batch feeds: var name -> tensor (or NumPy array).
    places : list of Place
        The places of the ``ParallelExecutor`` that consumes the feeds.
    batch_vars : iterable of str, optional
        Vars split along dim 0 (default: every tensor with at least one dim).
    prefetch : int
        How many prepared batches may wait.
    """

    def __init__(self, source, places, batch_vars=None, prefetch=2):
        if prefetch < 1:
            raise SSAExecError(f"prefetch must be >= 1, got {prefetch}")
        self.places = list(places)
        self.batch_vars = None if batch_vars is None else set(batch_vars)
        self._queue = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._copy_streams = {}
        if any(p.is_cuda for p in self.places):
            for p in self.places:
                if p.is_cuda and p.device not in self._copy_streams:
                    self._copy_streams[p.device] = torch.cuda.Stream(p.device)
        self._thread = threading.Thread(target=self._produce, args=(iter(source),),
                                        name="ssaexec-dataloader", daemon=True)
        self._thread.start()

    def _prepare(self, feed):
        if not isinstance(feed, dict):
            raise FeedError(f"DataLoader items must be dicts of var name -> tensor, got "
                            f"{type(feed).__name__}")
        n = len(self.places)
        per_place = [{} for _ in range(n)]
        for name, value in feed.items():
            t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
            split = t.dim() > 0 and (self.batch_vars is None or name in self.batch_vars)
            parts = _split(t, n, name) if split else [t] * n
            for d, part, place in zip(per_place, parts, self.places, strict=True):
                d[name] = self._to_place(part, place)
        events = []
        for stream in self._copy_streams.values():
            ev = torch.cuda.Event()
            ev.record(stream)
            events.append(ev)
        for ev in events:
            ev.synchronize()  # the copies are complete before the consumer sees the batch
        return per_place

    def _to_place(self, t, place):
        if not place.is_cuda:
            return t
        stream = self._copy_streams[place.device]
        host = t.contiguous().pin_memory() if not t.is_cuda else t
        with torch.cuda.stream(stream):
            return host.to(place.device, non_blocking=True)

    def _produce(self, it):
        try:
            for feed in it:
                item = self._prepare(feed)
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._put_final(_END)
        except BaseException as e:  # noqa: B036 - hand every failure to the consumer
            self._put_final(_Failure(e))

    def _put_final(self, item):
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            if self._stop.is_set():
                raise StopIteration
            try:
                item = self._queue.get(timeout=0.1)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise StopIteration from None
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.exc
        return item

    def close(self):
        """Stop the background thread (idempotent)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
