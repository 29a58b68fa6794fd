"""A dependency-free progress line for long runs (stderr; one line per step when not a TTY)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, stream=None) -> None:
        self.total = max(total, 1)
        self.label = label
        self.done = 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = time.perf_counter()

    def step(self, desc: str) -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.t0
        width = 24
        filled = int(width * self.done / self.total)
        bar = "#" * filled + "." * (width - filled)
        line = f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:5.0f}s  {desc}"
        if self.tty:
            self.stream.write("\r\033[K" + line[:160])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
