"""No measurements, run numbers or journal citations in comments and docstrings.

The measurements that justify a default live in docs/performance.md; the source keeps the
reason in words. This test reads every comment and docstring under src/tritonkit (and the
README) and fails with file:line for each figure or citation it finds, so the rule cannot
quietly erode.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "tritonkit"
README = ROOT / "README.md"

PATTERNS = [
    re.compile(r"\bissue #?\d+", re.IGNORECASE),
    re.compile(r"\brun #?\d+\b", re.IGNORECASE),
    re.compile(r"performance\.md, \""),
    re.compile(r"tuned on an? [HA]\d00", re.IGNORECASE),
    re.compile(r"\b\d+(\.\d+)? ?(GB/s|TB/s|TFLOP/s)"),
    re.compile(r"\b\d+(\.\d+)? ?(us|ms)\b(?! *[=:])"),
]

# Paths a sweep has not reached yet (none: every file of src/ and the README are held to it).
EXCLUDE: frozenset[str] = frozenset()


def _excluded(rel: str, exclude: frozenset[str]) -> bool:
    return any(rel == e or rel.startswith(e + "/") for e in exclude)


def _docstring_lines(tree: ast.AST) -> set[int]:
    """First lines of the string tokens that are docstrings (module, class, def)."""
    starts = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                starts.add((body[0].value.lineno, body[0].value.col_offset))
    return starts


def prose(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring line in a Python source."""
    doc_starts = _docstring_lines(ast.parse(source))
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and tok.start in doc_starts:
            for i, line in enumerate(tok.string.splitlines()):
                out.append((tok.start[0] + i, line))
    return out


def offences(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return [(n, text.strip()) for n, text in lines if any(p.search(text) for p in PATTERNS)]


def scan(root: Path = ROOT, exclude: frozenset[str] = EXCLUDE) -> list[str]:
    """``file:line: text`` of every comment or docstring line under ``root``'s src/tritonkit
    (and every line of its README.md) that a pattern matches, skipping ``exclude``."""
    found = []
    for path in sorted((root / "src" / "tritonkit").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if _excluded(rel, exclude):
            continue
        for n, text in offences(prose(path.read_text(encoding="utf-8"))):
            found.append(f"{rel}:{n}: {text}")
    readme = root / "README.md"
    if readme.exists() and not _excluded("README.md", exclude):
        lines = list(enumerate(readme.read_text(encoding="utf-8").splitlines(), 1))
        for n, text in offences(_prose(lines)):
            found.append(f"README.md:{n}: {text}")
    return found


def _prose(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The README's lines outside its generated results table (between the summary markers
    that `tritonkit report --readme` writes): a measured table is the README's one place for
    figures, generated from committed results."""
    out, generated = [], False
    for n, text in lines:
        if "summary:begin" in text:
            generated = True
        elif "summary:end" in text:
            generated = False
        elif not generated:
            out.append((n, text))
    return out


def test_no_citations_in_src_or_readme():
    found = scan()
    assert not found, (
        "measurements or run/issue/journal citations in comments or docstrings (move the figures "
        "to docs/performance.md, keep the reason in words):\n" + "\n".join(found)
    )


def test_exclusions_exist():
    # A stale entry would silently exempt a file created later under the same name.
    missing = sorted(e for e in EXCLUDE if not (ROOT / e).exists())
    assert not missing, f"EXCLUDE names paths that do not exist: {missing}"


_PLANTED = '''"""Module docstring: the kernel ran at 3132 GB/s (run 12)."""

FMT = "{:.3f} ms"  # a format string in code is not prose
TIMEOUT_MS = 5  # 5 ms=the limit: a value, not a measurement


def f(x):
    """Docstring: see docs/performance.md, "final figures"."""
    label = "52.5 us, issue 29"  # not a docstring: code may format units
    return x  # tuned on an H200 at 0.173 ms


class C:
    """A chunk keeps a row in L2 between the two sweeps (a clean line).

    The sweep took 52.5 us at (4096, 65536).
    """

    def g(self):
        """1.4x faster after issue #7."""
        return "4.8 TB/s"
'''


def test_scanner_catches_planted_citations(tmp_path):
    pkg = tmp_path / "src" / "tritonkit"
    pkg.mkdir(parents=True)
    (pkg / "planted.py").write_text(_PLANTED)
    (pkg / "skipped.py").write_text("# 99 GB/s in a file the caller excludes\n")
    (tmp_path / "README.md").write_text("Fast.\n\nIt runs at 4100 GB/s.\n")
    found = scan(tmp_path, exclude=frozenset({"src/tritonkit/skipped.py"}))
    lines = [f.split(": ", 1)[0] for f in found]
    assert lines == [
        "src/tritonkit/planted.py:1",  # module docstring: GB/s and run 12
        "src/tritonkit/planted.py:8",  # def docstring: a journal section quoted
        "src/tritonkit/planted.py:10",  # comment: tuned on an H200, 0.173 ms
        "src/tritonkit/planted.py:16",  # a class docstring's third line: 52.5 us
        "src/tritonkit/planted.py:20",  # method docstring: issue #7
        "README.md:3",
    ], found
    # Code strings (lines 3, 9, 21), the docstring's clean first line and "5 ms=" are not
    # flagged, nor the excluded file.


@pytest.mark.parametrize(
    "text, flagged",
    [
        ("# took 0.173 ms", True),
        ("# took 173us", True),
        ("# 3132 GB/s", True),
        ("# 989 TFLOP/s", True),
        ("# see run 12", True),
        ("# see Run #12", True),
        ("# issue 29 asked", True),
        ("# tuned on an A100", True),
        ('# (docs/performance.md, "final figures")', True),
        ("# ms: milliseconds", False),
        ("# a timeout of ms = 5", False),
        ("# runs 2 programs per SM", False),
        ("# see docs/performance.md", False),
        ("# the tensor cores' issue rate", False),
    ],
)
def test_patterns(text, flagged):
    assert bool(offences([(1, text)])) is flagged
