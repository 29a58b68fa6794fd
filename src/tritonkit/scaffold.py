"""``tritonkit new NAME``: a new operator family from the templates in ``templates/operator``;
``tritonkit new --remove NAME`` takes it out again.

It writes the set one operator is made of (docs/DESIGN.md, "Adding an operator"): the family
package ``ops/NAME/`` in the shape every family has (``kernels.py``, ``config.py``, ``plan.py``,
``function.py``: registration, autograd Function and public function), its spec ``specs/NAME.py``
(reference, inputs, shapes, bytes, FLOPs, baselines) and its test ``tests/test_NAME.py``, adds NAME
to ``ops.FAMILIES`` and its row to the bad-input table of ``tests/test_bad_input.py`` (which holds
every public function). The generated operator is a real one (``x + alpha * y`` with autograd)
whose test passes at once under the CPU interpreter; ``tritonkit list``, ``check`` and ``bench``
see it. The files pass the repository's ``ruff check`` and ``ruff format --check`` as written, for
any name of up to ``MAX_NAME`` characters (tests/test_scaffold.py).

``remove`` undoes exactly what ``scaffold`` did, and only that: it deletes the generated files
and takes the two edits out of the shared files, after checking that each is still what
``scaffold`` wrote. A family it did not write, or one changed since, is refused, and nothing
is removed.
"""

from __future__ import annotations

import keyword
import re
import shutil
from pathlib import Path

TEMPLATES = Path(__file__).parent / "templates" / "operator"

# template -> where it goes, relative to the repository root
FILES = {
    "ops_init.py.tmpl": "src/tritonkit/ops/{name}/__init__.py",
    "ops_kernels.py.tmpl": "src/tritonkit/ops/{name}/kernels.py",
    "ops_config.py.tmpl": "src/tritonkit/ops/{name}/config.py",
    "ops_plan.py.tmpl": "src/tritonkit/ops/{name}/plan.py",
    "ops_function.py.tmpl": "src/tritonkit/ops/{name}/function.py",
    "spec.py.tmpl": "src/tritonkit/specs/{name}.py",
    "test.py.tmpl": "tests/test_{name}.py",
}
_FAMILIES_FILE = "src/tritonkit/ops/__init__.py"
_BAD_INPUT_FILE = "tests/test_bad_input.py"
_BAD_INPUT_MARK = "    # `tritonkit new NAME` adds its operator's row above this line.\n"
# The longest name whose generated files stay within the line length (100), as formatted.
MAX_NAME = 32
_FAMILIES_END = re.compile(r"(FAMILIES: tuple\[str, \.\.\.\] = \((?:[^()]*?))(\n?\))", re.S)


class ScaffoldError(ValueError):
    """Why the operator cannot be scaffolded (bad name, existing files, no source checkout)."""


def source_root() -> Path:
    """The checkout tritonkit is imported from (an editable install or PYTHONPATH=src)."""
    root = Path(__file__).resolve().parents[2]
    if not ((root / "pyproject.toml").is_file() and (root / "tests").is_dir()):
        raise ScaffoldError(
            f"tritonkit is not imported from a source checkout ({root} has no pyproject.toml "
            "and tests/): install it editable (pip install -e .) or pass --root"
        )
    return root


def _check_name(name: str, root: Path) -> None:
    _check_identifier(name)
    families = _FAMILIES_END.search((root / _FAMILIES_FILE).read_text())
    if families is None:
        raise ScaffoldError(f"no 'FAMILIES: tuple[str, ...] = (...)' in {root / _FAMILIES_FILE}")
    if (
        name in re.findall(r'"(\w+)"', families.group(1))
        or (root / "src/tritonkit/ops" / name).exists()
    ):
        raise ScaffoldError(f"family {name!r} exists already")
    from tritonkit import functional
    from tritonkit.harness.spec import all_specs

    if name in functional.__all__ or name in {s.name for s in all_specs()}:
        raise ScaffoldError(f"{name!r} is a tritonkit function or operator already")
    if _BAD_INPUT_MARK not in (root / _BAD_INPUT_FILE).read_text():
        raise ScaffoldError(f"no line {_BAD_INPUT_MARK.strip()!r} in {root / _BAD_INPUT_FILE}")
    taken = [p for p in (root / f.format(name=name) for f in FILES.values()) if p.exists()]
    if taken:
        raise ScaffoldError(f"{', '.join(map(str, taken))} exists already")


def _check_identifier(name: str) -> None:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise ScaffoldError(
            f"operator name must be a lowercase Python identifier (e.g. scaled_add), got {name!r}"
        )
    if len(name) > MAX_NAME:
        raise ScaffoldError(
            f"operator name must have at most {MAX_NAME} characters, got {len(name)} ({name!r})"
        )


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def render(template: str, name: str) -> str:
    text = (TEMPLATES / template).read_text()
    return text.replace("{{name}}", name).replace("{{Name}}", _camel(name))


def add_family(root: Path, name: str) -> Path:
    """Append ``name`` to the FAMILIES tuple of ops/__init__.py."""
    path = root / _FAMILIES_FILE
    text = path.read_text()
    match = _FAMILIES_END.search(text)
    assert match is not None  # _check_name found it
    body = match.group(1).rstrip()
    if not body.endswith(("(", ",")):
        body += ","
    updated = f'{body}\n    "{name}",\n)'
    path.write_text(text[: match.start()] + updated + text[match.end() :])
    return path


def add_bad_input_row(root: Path, name: str) -> Path:
    """Insert the operator's row into the TABLE of tests/test_bad_input.py, at its marker."""
    path = root / _BAD_INPUT_FILE
    text = path.read_text()
    row = render("bad_input_row.py.tmpl", name)
    path.write_text(text.replace(_BAD_INPUT_MARK, row + _BAD_INPUT_MARK, 1))
    return path


def scaffold(name: str, root: Path | None = None) -> list[Path]:
    """Write the new operator's files under ``root`` (default: the source checkout); returns
    the paths written or changed."""
    root = Path(root) if root is not None else source_root()
    _check_name(name, root)
    written = []
    for template, target in FILES.items():
        path = root / target.format(name=name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(template, name))
        written.append(path)
    written.append(add_family(root, name))
    written.append(add_bad_input_row(root, name))
    return written


def _rel(path: Path, root: Path) -> str:
    return str(path.relative_to(root))


def _family_line(name: str) -> str:
    return f'    "{name}",\n'


def remove(name: str, root: Path | None = None) -> list[Path]:
    """Undo ``scaffold(name)``: delete the files it wrote, take its entry out of
    ``ops.FAMILIES`` and its row out of tests/test_bad_input.py; returns the paths removed or
    changed.

    Everything is checked first: each generated file must hold what ``scaffold`` wrote (a file
    changed since is the user's work), the family package nothing else, the FAMILIES entry and
    the bad-input row their scaffolded form. Otherwise ScaffoldError says what differs and
    nothing is touched. Generated files already deleted by hand are passed over.
    """
    root = Path(root) if root is not None else source_root()
    _check_identifier(name)
    families_path, bad_input_path = root / _FAMILIES_FILE, root / _BAD_INPUT_FILE
    families_text, bad_input_text = families_path.read_text(), bad_input_path.read_text()
    files = {root / target.format(name=name): template for template, target in FILES.items()}
    present = [p for p in files if p.exists()]
    match = _FAMILIES_END.search(families_text)
    listed = match is not None and name in re.findall(r'"(\w+)"', match.group(1))
    row = render("bad_input_row.py.tmpl", name)
    has_row = row in bad_input_text
    if not (present or listed or has_row):
        raise ScaffoldError(f"nothing of `tritonkit new {name}` found under {root}")
    changed = [_rel(p, root) for p in present if p.read_text() != render(files[p], name)]
    if changed:
        raise ScaffoldError(
            f"nothing removed: not what `tritonkit new {name}` wrote (changed since, or not "
            f"written by it): {', '.join(changed)}"
        )
    package = root / "src/tritonkit/ops" / name
    others = sorted(
        _rel(p, root)
        for p in (package.rglob("*") if package.is_dir() else ())
        if p.is_file() and p not in files and "__pycache__" not in p.relative_to(package).parts
    )
    if others:
        raise ScaffoldError(
            f"nothing removed: {_rel(package, root)} holds files `tritonkit new {name}` did not "
            f"write: {', '.join(others)}"
        )
    if listed and _family_line(name) not in match.group(1) + "\n":
        raise ScaffoldError(
            f"nothing removed: {_FAMILIES_FILE} lists {name!r} otherwise than `tritonkit new` "
            "writes it"
        )
    if not has_row and f'Row("{name}",' in bad_input_text:
        raise ScaffoldError(
            f"nothing removed: the {name!r} row of {_BAD_INPUT_FILE} changed since "
            "`tritonkit new` wrote it"
        )
    removed = []
    for path in present:
        path.unlink()
        removed.append(path)
    if package.is_dir():  # nothing left in it but bytecode
        shutil.rmtree(package)
    if listed:
        body = (match.group(1) + "\n").replace(_family_line(name), "", 1).removesuffix("\n")
        families_path.write_text(
            families_text[: match.start()] + body + match.group(2) + families_text[match.end() :]
        )
        removed.append(families_path)
    if has_row:
        bad_input_path.write_text(bad_input_text.replace(row, "", 1))
        removed.append(bad_input_path)
    return removed
