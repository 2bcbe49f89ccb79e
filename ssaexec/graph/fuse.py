"""Gradient bucketing for fused all-reduce (``BuildStrategy(fuse_all_reduce_ops=True)``).

Gradients join a bucket in the order the backward pass produces them (the
last layer's first, as DistributedDataParallel's reverse parameter order
approximates). A bucket is closed when it reaches ``fuse_bucket_mb``; the first
bucket closes at 1 MiB (or the cap, if smaller) so communication starts early,
as DDP does. A bucket holds one dtype. The runtime flattens a bucket into one
buffer per place, all-reduces it once and copies the result back.
"""

__all__ = ["GradBucketer", "FIRST_BUCKET_BYTES"]

FIRST_BUCKET_BYTES = 1 << 20


class GradBucketer:
    """Collects gradient names into buckets of about ``cap_bytes``."""

    __slots__ = ("cap", "first_cap", "names", "nbytes", "dtype", "closed")

    def __init__(self, cap_bytes):
        self.cap = int(cap_bytes)
        self.first_cap = min(FIRST_BUCKET_BYTES, self.cap)
        self.names, self.nbytes, self.dtype, self.closed = [], 0, None, 0

    def add(self, name, nbytes, dtype):
        """Add a gradient; return the buckets (lists of names) that are now complete."""
        done = []
        if self.names and dtype != self.dtype:
            done.append(self.take())
        self.names.append(name)
        self.nbytes += nbytes
        self.dtype = dtype
        if self.nbytes >= (self.first_cap if self.closed == 0 else self.cap):
            done.append(self.take())
        return done

    def take(self):
        """Close the open bucket and return its names (possibly empty)."""
        names = self.names
        if names:
            self.closed += 1
        self.names, self.nbytes, self.dtype = [], 0, None
        return names

    def holds(self, names):
        """True if any of ``names`` waits in the open bucket."""
        return any(n in self.names for n in names)
