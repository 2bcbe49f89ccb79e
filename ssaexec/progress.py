"""A small progress bar for long loops (stderr; plain lines when not a terminal)."""

import sys
import time

__all__ = ["Progress"]


class Progress:
    """``with Progress(total, "train") as bar: bar.update(1, loss=0.3)``.

    On a terminal it redraws one line; otherwise it prints a line every
    ``every`` steps (and the last), so logs stay readable.
    """

    __slots__ = ("total", "label", "done", "start", "stream", "tty", "every", "enabled")

    def __init__(self, total, label="", stream=None, enabled=True, every=None):
        self.total = max(1, int(total))
        self.label = label
        self.done = 0
        self.start = time.perf_counter()
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every = every or max(1, self.total // 10)
        self.enabled = enabled

    def update(self, n=1, **info):
        """Advance by ``n`` and show ``info`` (e.g. loss=...) beside the bar."""
        self.done += n
        if not self.enabled:
            return
        if not self.tty and self.done % self.every and self.done != self.total:
            return
        frac = self.done / self.total
        width = 24
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        elapsed = time.perf_counter() - self.start
        extra = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in info.items())
        line = f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:5.1f}s {extra}"
        if self.tty:
            self.stream.write("\r" + line.ljust(100))
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.enabled and self.tty and self.done < self.total:
            self.stream.write("\n")
