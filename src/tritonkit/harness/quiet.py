"""Library noise kept off the command line's stderr (``--debug`` lets it through).

What reaches a user of ``tritonkit`` on stderr is tritonkit's: its progress, its one-line
errors and its own warnings (a corrupt tuning cache, replay turned off), one line each. Other
libraries speak through two channels, and both are closed here:

- Python ``warnings``: NumPy's about the NaN and inf the checks inject (the interpreter computes
  with NumPy), PyTorch's C++ warnings relayed to the calling line ("Sparse CSR tensor support is
  in beta", attributed to tritonkit's own file, so a filter by module cannot catch it), Dynamo's
  graph-break warnings, deprecations. Only messages tritonkit wrote itself (they start with
  ``tritonkit``) are shown.
- ``logging``: torch._dynamo's graph breaks and "hit config.recompile_limit" from the
  torch.compile baselines, inductor's, Triton's. Every ``torch`` and ``triton`` logger is raised
  to ERROR (PyTorch gives its components loggers of their own, with their own level and handler,
  so the root logger's level does not reach them). Not where the user asked for logs
  (``TORCH_LOGS``), nor torch's structured trace (``TORCH_TRACE``), which writes to files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator

# tritonkit's own warnings: every one says so first ("tritonkit: autotune cache ... is corrupt",
# "tritonkit.nn.sdpa_patch: ...").
OWN_MESSAGE = r"tritonkit\b"
LIBRARIES = ("torch", "triton")


def _library_loggers() -> list[logging.Logger]:
    """The loggers of torch and triton that exist now (their children, created later, inherit
    the level of the nearest one here)."""
    if os.environ.get("TORCH_LOGS"):
        return []
    names = [
        name
        for name in list(logging.root.manager.loggerDict)
        if name.split(".")[0] in LIBRARIES and name != "torch.__trace"
    ]
    return [logging.getLogger(n) for n in dict.fromkeys([*LIBRARIES, *names])]


def _show(message, category, filename, lineno, file=None, line=None) -> None:
    text = re.sub(r"^tritonkit:\s*", "", str(message))
    print(f"tritonkit: warning: {text}", file=sys.stderr)


def _install_filters() -> None:
    warnings.simplefilter("ignore")
    warnings.filterwarnings("always", message=OWN_MESSAGE)
    warnings.showwarning = _show


@contextlib.contextmanager
def quiet(debug: bool = False) -> Iterator[None]:
    """While active, other libraries' warnings and log records below ERROR are dropped and
    tritonkit's own warnings print as one ``tritonkit: warning:`` line; ``debug`` changes
    nothing. Warning filters, ``showwarning`` and logger levels are restored on exit."""
    if debug:
        yield
        return
    loggers = _library_loggers()
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        _install_filters()
        for lg in loggers:
            lg.setLevel(max(lg.getEffectiveLevel(), logging.ERROR))
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def silence_process() -> None:
    """``quiet`` for the rest of a process of our own (a compile-ahead worker): never undone."""
    _install_filters()
    for lg in _library_loggers():
        lg.setLevel(max(lg.getEffectiveLevel(), logging.ERROR))
