"""``tritonkit new``: the scaffolded operator works at once, in a copy of the repository."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tritonkit import scaffold

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


@pytest.mark.slow
def test_new_operator_passes_its_tests_and_the_workbench(tmp_path):
    """``tritonkit new foo`` in a copy of the repository; then the fast tier of its own test and
    of the package-level tests, ``tritonkit check foo``, and ``tritonkit list`` shows it."""
    root = _copy_repo(tmp_path)
    out = _run(root, "-m", "tritonkit", "new", "foo").stdout
    assert "tests/test_foo.py" in out and "ops/foo/kernel.py" in out
    _run(root, "-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider",
         "tests/test_foo.py", "tests/test_cli.py", "tests/test_public_api.py",
         "tests/test_bad_input.py", "-k", "foo or every_public or export")  # fmt: skip
    check = _run(root, "-m", "tritonkit", "check", "foo").stdout
    assert "checks passed" in check and "failed" not in check
    listing = _run(root, "-m", "tritonkit", "list").stdout
    assert "| foo | foo |" in listing
