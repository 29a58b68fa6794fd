"""``tritonkit new``: the scaffolded operator works at once and passes the repository's lint, in
a copy of the repository; ``tritonkit new --remove`` undoes it exactly, and only it."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tritonkit import cli, scaffold

ROOT = Path(__file__).resolve().parents[1]


def _copy_repo(dest: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for part in ("src", "tests"):
        shutil.copytree(ROOT / part, dest / part, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _run(root: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    proc = subprocess.run(
        [sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, f"{args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_bad_names_are_refused(tmp_path):
    root = _copy_repo(tmp_path)
    for bad, why in [
        ("Foo", "lowercase Python identifier"),
        ("class", "lowercase Python identifier"),
        ("2x", "lowercase Python identifier"),
        ("norm", "exists already"),
        ("gelu", "tritonkit function or operator already"),
        ("z" * (scaffold.MAX_NAME + 1), f"at most {scaffold.MAX_NAME} characters"),
    ]:
        with pytest.raises(scaffold.ScaffoldError, match=why):
            scaffold.scaffold(bad, root=root)
    assert not (root / "src/tritonkit/ops/Foo").exists()


def _families(root: Path) -> tuple:
    scope: dict = {}
    exec((root / "src/tritonkit/ops/__init__.py").read_text(), scope)
    return scope["FAMILIES"]


def test_new_operator_gets_a_bad_input_row(tmp_path):
    root = _copy_repo(tmp_path)
    scaffold.add_bad_input_row(root, "zz_probe")
    text = (root / "tests/test_bad_input.py").read_text()
    row = text.index('Row("zz_probe", tritonkit.zz_probe,')
    assert row < text.index("adds its operator's row above this line") < text.index("]  # fmt")


def test_add_family_appends_to_the_tuple(tmp_path):
    root = _copy_repo(tmp_path)
    before = _families(root)
    scaffold.add_family(root, "zz_probe")
    assert _families(root) == (*before, "zz_probe")
    assert (root / "src/tritonkit/ops/__init__.py").read_text().endswith('    "zz_probe",\n)\n')


def _ruff() -> str:
    try:
        from ruff.__main__ import find_ruff_bin

        return str(find_ruff_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("ruff")
        if found is None:
            pytest.skip("ruff is not installed (pip install -e .[dev])")
        return found


def test_generated_files_pass_ruff_check_and_format(tmp_path):
    """What ``tritonkit new`` writes passes the README's own lint as it stands, for a short name,
    a usual one and the longest allowed (whose lines are the longest): the five new files and
    the two shared files it edits."""
    root = _copy_repo(tmp_path)
    written = set()
    for name in ("q", "my_op", "z" * scaffold.MAX_NAME):
        written.update(scaffold.scaffold(name, root=root))
    files = sorted(str(p.relative_to(root)) for p in written)
    assert len(files) == 3 * len(scaffold.FILES) + 2
    ruff = _ruff()
    for args in (["check"], ["format", "--check", "--diff"]):
        proc = subprocess.run(
            [ruff, *args, "--no-cache", *files], cwd=root, capture_output=True, text=True
        )
        assert proc.returncode == 0, f"ruff {args[0]}:\n{proc.stdout}\n{proc.stderr}"


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under src/ and tests/ (bytecode aside), by path: what the repository holds."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for part in ("src", "tests")
        for p in sorted((root / part).rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_remove_undoes_new_exactly(tmp_path, capsys):
    """``new NAME`` then ``new --remove NAME`` (through the CLI) leaves the repository byte for
    byte as it was: the generated files, the package directory (with the bytecode an import
    left in it), the FAMILIES entry and the bad-input row all gone."""
    root = _copy_repo(tmp_path)
    before = _tree(root)
    assert cli.main(["new", "zz_probe", "--root", str(root)]) == 0
    added = set(_tree(root)) - set(before)
    assert added == {f.format(name="zz_probe") for f in scaffold.FILES.values()}
    assert "zz_probe" in _families(root)
    cache = root / "src/tritonkit/ops/zz_probe/__pycache__"
    cache.mkdir()
    (cache / "kernels.cpython-311.pyc").write_bytes(b"\0")
    capsys.readouterr()
    assert cli.main(["new", "--remove", "zz_probe", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert "removed " in out and "edited " in out and "test_bad_input.py" in out
    assert _tree(root) == before
    assert not (root / "src/tritonkit/ops/zz_probe").exists()


def test_remove_refuses_what_new_did_not_write(tmp_path, capsys):
    """A family ``new`` did not write, a generated file changed since, a file added to the
    package, or an edited bad-input row: refused with the reason, and nothing is touched."""
    root = _copy_repo(tmp_path)
    with pytest.raises(scaffold.ScaffoldError, match="not what `tritonkit new norm` wrote"):
        scaffold.remove("norm", root=root)
    with pytest.raises(scaffold.ScaffoldError, match="nothing of `tritonkit new zz_none` found"):
        scaffold.remove("zz_none", root=root)
    with pytest.raises(scaffold.ScaffoldError, match="lowercase Python identifier"):
        scaffold.remove("../norm", root=root)
    scaffold.scaffold("zz_probe", root=root)
    kernel = root / "src/tritonkit/ops/zz_probe/kernels.py"
    bad_input = root / "tests/test_bad_input.py"
    extra = root / "src/tritonkit/ops/zz_probe/notes.md"
    row = scaffold.render("bad_input_row.py.tmpl", "zz_probe")
    edits = [
        (kernel, lambda t: t + "# mine\n", "nothing removed: .*wrote .*: [^ ]*kernels.py$"),
        (extra, lambda t: "mine\n", "did not write: .*notes.md"),
        (bad_input, lambda t: t.replace(row, row.replace("2.0", "3.0")), "row .* changed since"),
    ]
    for path, change, why in edits:
        original = path.read_text() if path.exists() else None
        path.write_text(change(original or ""))
        state = _tree(root)
        with pytest.raises(scaffold.ScaffoldError, match=why):
            scaffold.remove("zz_probe", root=root)
        assert _tree(root) == state  # nothing removed
        if original is None:
            path.unlink()
        else:
            path.write_text(original)
    capsys.readouterr()
    assert cli.main(["new", "--remove", "norm", "--root", str(root)]) == 2
    assert capsys.readouterr().err.startswith("tritonkit: nothing removed: not what")
    scaffold.remove("zz_probe", root=root)
    assert "zz_probe" not in _families(root)


@pytest.mark.slow
def test_new_operator_passes_its_tests_and_the_workbench(tmp_path):
    """``tritonkit new foo`` in a copy of the repository; then the fast tier of its own test and
    of the package-level tests, ``tritonkit check foo``, and ``tritonkit list`` shows it."""
    root = _copy_repo(tmp_path)
    out = _run(root, "-m", "tritonkit", "new", "foo").stdout
    assert "tests/test_foo.py" in out and "ops/foo/kernels.py" in out
    _run(root, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider",
         "tests/test_foo.py", "tests/test_cli.py", "tests/test_public_api.py",
         "tests/test_bad_input.py", "-k", "foo or every_public or export")  # fmt: skip
    check = _run(root, "-m", "tritonkit", "check", "foo").stdout
    assert "checks passed" in check and "failed" not in check
    listing = _run(root, "-m", "tritonkit", "list").stdout
    assert "| foo | foo |" in listing
    _run(root, "-m", "tritonkit", "new", "--remove", "foo")
    assert "| foo | foo |" not in _run(root, "-m", "tritonkit", "list").stdout
