"""A dependency-free progress display for long runs: the case being run and the time left.

On a terminal it redraws one line (a bar, cases done, elapsed time, an estimate of what is
left, the case being run); elsewhere (CI logs, pipes) it prints a line for each summary the
caller logs and otherwise at most one line every ``heartbeat`` seconds, so that a long run is
never silent and a log never fills with thousands of lines. Everything goes to stderr, so the
results printed on stdout stay clean.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def plural(n: int, noun: str) -> str:
    """``1 operator``, ``3 operators``: a count with its noun (regular plurals only)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``1h12m``: short enough for a progress line."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """Progress over ``total`` cases.

    ``running(desc)`` says which case starts (the previous one, if any, counts as done);
    ``step(desc)`` says a case finished; ``log(line)`` prints a line that stays (a summary).
    Without ``expected``, the cases cost alike: the estimate of what is left is the mean time
    per finished case times the cases left. With ``expected`` (the seconds a cost model gives
    the whole run), each case brings its own expected ``cost``: the estimate is shown from the
    start (the model's) and is the model's for what is left, scaled by how the cases done so
    far compared with it (shrunk toward the model while few are done).
    """

    def __init__(
        self,
        total: int,
        label: str,
        stream: TextIO | None = None,
        heartbeat: float = 30.0,
        clock=time.perf_counter,
        expected: float | None = None,
    ) -> None:
        self.total = max(total, 1)
        self.expected = expected
        self.cost_done = 0.0
        self._current_cost = 0.0
        self.label = label
        self.done = 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.heartbeat = heartbeat
        self.clock = clock
        self.t0 = clock()
        self._current = ""
        self._started = False
        self._last_draw = -1e9
        self._last_line = self.t0

    def estimate_left(self) -> float | None:
        """Seconds left, from the cases done so far (None before the first one finishes)."""
        elapsed = self.clock() - self.t0
        if self.expected is not None:
            left = max(self.expected - self.cost_done, 0.0)
            prior = 0.02 * self.expected  # the model's weight while few cases are done
            return left * (elapsed + prior) / (self.cost_done + prior) if prior > 0 else 0.0
        if self.done == 0:
            return None
        return elapsed / self.done * max(self.total - self.done, 0)

    def status(self) -> str:
        width = 24
        filled = min(width, int(width * self.done / self.total))
        bar = "#" * filled + "." * (width - filled)
        left = self.estimate_left()
        eta = f", ~{duration(left)} left" if left is not None and self.done < self.total else ""
        elapsed = duration(self.clock() - self.t0)
        return f"{self.label} [{bar}] {self.done}/{self.total} {elapsed}{eta}"

    def running(self, desc: str, cost: float = 0.0) -> None:
        if self._started:
            self.done += 1
            self.cost_done += self._current_cost
        self._started = True
        self._current = desc
        self._current_cost = cost
        self._draw()

    def step(self, desc: str, cost: float = 0.0) -> None:
        self.done += 1
        self.cost_done += cost
        self._current = desc
        self._draw()

    def log(self, line: str) -> None:
        text = f"{self.status()}  {line}"
        if self.tty:
            self.stream.write("\r\033[K" + text + "\n")
        else:
            self.stream.write(text + "\n")
        self._last_line = self.clock()
        self.stream.flush()
        self._draw(force=True)

    def _draw(self, force: bool = False) -> None:
        now = self.clock()
        if self.tty:
            if force or now - self._last_draw >= 0.1:  # redrawing costs more than a small case
                line = f"{self.status()}  {self._current}"
                self.stream.write("\r\033[K" + line[:160])
                self.stream.flush()
                self._last_draw = now
        elif now - self._last_line >= self.heartbeat:
            self.stream.write(f"{self.status()}  {self._current}\n")
            self.stream.flush()
            self._last_line = now

    def close(self) -> None:
        if self._started and self.done < self.total:
            self.done += 1
            self.cost_done += self._current_cost
        if self.tty:
            self.stream.write("\r\033[K")
            self.stream.flush()
