"""The one progress bar of ssaexec: the demo, the benchmark and the command line use it.

On a terminal it redraws one line in place; elsewhere (a log file, a pipe) it
either prints a plain line every few steps, so logs stay readable, or, with
``plain=False``, draws nothing (the CLI: its bar is only a terminal decoration).
``clear()`` erases the bar so that the caller can print a line of its own; the
next ``update`` draws it again below. ``TERM=dumb`` counts as no terminal.

Why our own and not tqdm or rich: its drawing is about 20 lines, the core package depends
only on torch, networkx and numpy and a progress bar is no reason to add one,
and the CLI needs exactly this clear-before-print behaviour on a shared stderr
(with byte-stable output for its tests), which is simpler to own than to configure.
"""

import os
import sys
import time

__all__ = ["Progress"]


class Progress:
    """``with Progress(total, "train") as bar: bar.update(1, loss=0.3)``.

    Parameters
    ----------
    total : int
    label : str
        Printed before the bar.
    stream : file, optional
        Where to draw (default: stderr).
    enabled : bool
        False: count, never draw.
    every : int, optional
        Plain mode: print a line every ``every`` steps (and the last); default total/10.
    plain : bool
        True: plain lines when ``stream`` is not a terminal, and the finished bar
        stays on its line. False: draw on a terminal only, and ``close()`` erases it.
    width, fill, timer :
        The bar's look: its width in characters, the character of its empty part,
        and whether to show the elapsed seconds.
    """

    __slots__ = ("total", "label", "done", "start", "stream", "tty", "every", "enabled",
                 "plain", "width", "fill", "timer", "shown")

    def __init__(self, total, label="", stream=None, enabled=True, every=None, *, plain=True,
                 width=24, fill="-", timer=True):
        self.total = max(1, int(total))
        self.label = label
        self.done = 0
        self.start = time.perf_counter()
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.tty = bool(isatty()) and os.environ.get("TERM") != "dumb"
        self.every = every or max(1, self.total // 10)
        self.enabled = enabled
        self.plain, self.width, self.fill, self.timer = plain, width, fill, timer
        self.shown = False  # the bar is on the terminal's current line

    def update(self, n=1, suffix="", **info):
        """Advance by ``n``; show ``suffix`` and ``info`` (e.g. loss=...) beside the bar."""
        self.done += n
        if not self.enabled or not (self.tty or self.plain):
            return
        if not self.tty and self.done % self.every and self.done != self.total:
            return
        filled = int(self.width * min(self.done, self.total) / self.total)
        bar = "#" * filled + self.fill * (self.width - filled)
        words = [suffix] if suffix else []
        words += [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in info.items()]
        elapsed = f" {time.perf_counter() - self.start:5.1f}s" if self.timer else ""
        line = (f"{self.label} " if self.label else "") + \
            f"[{bar}] {self.done}/{self.total}{elapsed} {' '.join(words)}"
        if self.tty:
            self.stream.write(f"\r{line}\x1b[K")
            self.shown = True
            if self.plain and self.done >= self.total:
                self.stream.write("\n")
                self.shown = False
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def clear(self):
        """Erase the bar from the terminal (before printing a line of one's own)."""
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False

    def close(self):
        """Finish: end the bar's line (``plain``), or erase the bar (``plain=False``)."""
        if not self.plain:
            self.clear()
        elif self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
