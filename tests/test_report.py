"""The report on GPU results, rendered as users render it (no GPU needed).

Every results document committed under benchmarks/results/ and a synthetic GPU document that
holds every column and case (tests/_synthetic.py: wall speedups, bootstrap intervals, skipped
and absent baselines, a failed check, a case left out, an operator without a backward, variants
side by side, host-bound calls, flags and notes) go through ``tritonkit report``,
``tritonkit report --readme`` and ``tritonkit regress``; the Markdown they write is compared
with the expected files under tests/data/report/. Other JSON files there (what benchmarks/ and
experiments/ scripts write) are refused by ``report`` in one line.

After an intended change to what the report says, regenerate the expected files and read
their diff before committing it:

    TRITONKIT_REGENERATE=1 python -m pytest -q tests/test_report.py

The committed documents are rendered with the plots left out (drawing hundreds of records
takes tens of seconds on a small CPU); the synthetic documents draw every plot, and the slow
test draws the committed ones' too.
"""

import difflib
import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

from tritonkit.cli import main
from tritonkit.harness import plots, report

from _synthetic import (
    synthetic_gpu_document,
    synthetic_interpreter_document,
    synthetic_regression,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DATA = Path(__file__).parent / "data" / "report"
REGENERATE = os.environ.get("TRITONKIT_REGENERATE") == "1"
README = "\n\n".join(
    [
        "intro",
        f"{report.README_SUMMARY_BEGIN}\nstale\n{report.README_SUMMARY_END}",
        f"{report.README_BEGIN}\nstale\n{report.README_END}",
        f"{report.README_HOST_BEGIN}\nstale\n{report.README_HOST_END}",
        "outro\n",
    ]
)


def _json_files() -> tuple[list[Path], list[Path]]:
    """The committed JSON files: results documents, and the others."""
    documents, others = [], []
    for path in sorted(RESULTS.rglob("*.json")):
        data = json.loads(path.read_text())
        is_results = isinstance(data, dict) and data.get("schema") == report.SCHEMA
        (documents if is_results else others).append(path)
    return documents, others


DOCUMENTS, OTHERS = _json_files()


def _name(path: Path) -> str:
    return str(path.relative_to(RESULTS)).removesuffix(".json").replace("/", "--")


def expect(name: str, text: str) -> None:
    """``text`` equals tests/data/report/``name`` (or, with TRITONKIT_REGENERATE=1, becomes it)."""
    path = DATA / name
    if REGENERATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.is_file(), f"{path} is missing: run with TRITONKIT_REGENERATE=1 to write it"
    expected = path.read_text()
    if text != expected:
        diff = difflib.unified_diff(
            expected.splitlines(), text.splitlines(), str(path), "rendered", lineterm="", n=1
        )
        pytest.fail(
            f"{name} differs from {path} (TRITONKIT_REGENERATE=1 rewrites it):\n"
            + "\n".join(list(diff)[:60])
        )


def _without_images(markdown: str) -> str:
    """The report without its plots' lines (which plots exist depends on matplotlib)."""
    return re.sub(r"^!\[.*\n\n?", "", markdown, flags=re.MULTILINE)


@pytest.fixture
def no_plots(monkeypatch):
    for name in ("plot_roofline", "plot_bandwidth", "plot_accuracy"):
        monkeypatch.setattr(plots, name, lambda results, out_dir: None)
    monkeypatch.setattr(plots, "plot_speedups", lambda results, out_dir: [])


def _render(
    capsys, path: Path, out: Path, readme: Path | None = None, source: str = "", *extra: str
) -> str:
    """``tritonkit report PATH --out OUT [--readme README --source SOURCE]``: its report.md."""
    argv = ["report", str(path), "--out", str(out), *extra]
    if readme is not None:
        readme.write_text(README)
        argv += ["--readme", str(readme), "--source", source]
    code = main(argv)
    out_text, err = capsys.readouterr()
    assert code == 0, err
    assert err == "", err  # nothing but what it wrote, on stdout
    assert f"wrote {out / 'results.json'}, {out / 'report.md'}" in out_text
    return (out / "report.md").read_text()


def _regress(capsys, new: Path, old: Path, code: int) -> str:
    assert main(["regress", str(new), "--against", str(old)]) == code
    out, err = capsys.readouterr()
    assert err == "", err
    return out


def test_the_committed_documents_are_found():
    """The glob finds the results the README is generated from (a moved file fails here, not
    silently in the tests below)."""
    names = {p.name for p in DOCUMENTS}
    assert {"nvidia-h100.json", "nvidia-h200.json"} <= names
    assert RESULTS / "host-overhead-nvidia-h200.json" in OTHERS


@pytest.mark.parametrize("path", DOCUMENTS, ids=_name)
def test_committed_results_render(path, tmp_path, capsys, no_plots):
    """report, report --readme and regress (against itself) on each committed results file."""
    name = _name(path)
    source = str(path.relative_to(ROOT))
    md = _render(capsys, path, tmp_path / "r", tmp_path / "README.md", source)
    expect(f"{name}.report.md", md)
    expect(f"{name}.readme.md", (tmp_path / "README.md").read_text())
    out = _regress(capsys, path, path, 0)
    assert out.rstrip().endswith("no regression beyond 10%")
    expect(f"{name}.regress.md", out)


@pytest.mark.slow
@pytest.mark.parametrize("path", DOCUMENTS, ids=_name)
def test_committed_results_render_with_their_plots(path, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    md = _render(capsys, path, tmp_path / "r")
    assert _without_images(md) == (DATA / f"{_name(path)}.report.md").read_text()
    _assert_plots(md, tmp_path / "r")


@pytest.mark.parametrize("path", OTHERS, ids=_name)
def test_other_json_is_refused_in_one_line(path, capsys):
    """A JSON file that is not a results document (a benchmarks/ or experiments/ script's
    output): one line naming it and what it holds, exit 2."""
    assert main(["report", str(path), "--out", "/nonexistent/never-written"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1, err
    assert str(path) in lines[0] and "not a tritonkit results document" in lines[0]
    assert "its keys:" in lines[0] or "schema" in lines[0]


def test_host_overhead_table_re_renders():
    """host-overhead-nvidia-h200.json is benchmarks/host_overhead.py's: its committed table is
    what that script renders from it."""
    path = RESULTS / "host-overhead-nvidia-h200.json"
    script = ROOT / "benchmarks" / "host_overhead.py"
    spec = importlib.util.spec_from_file_location("host_overhead", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    doc = json.loads(path.read_text())
    md = path.with_suffix(".md").read_text()
    assert md.endswith(module._markdown(doc["rows"]))
    env = doc["environment"]
    assert md.startswith(f"Host time per call, ({module.ROWS}, {module.COLS}) ")
    assert f"{env['gpu']}, torch {env['torch']}" in md and f"commit {env['git_commit']}" in md


def _assert_plots(md: str, out: Path) -> set[str]:
    """Every plot written is linked from report.md and has a name without spaces."""
    written = {p.name for p in out.glob("*.png")}
    linked = set(re.findall(r"^!\[[^\]]*\]\(([^)]+)\)$", md, flags=re.MULTILINE))
    assert linked == written
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+", name) for name in written), written
    return written


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_synthetic_gpu_document_renders(tmp_path, capsys):
    """Every column and case of a GPU report, its README tables and its plots (with --debug,
    so that a NaN or an infinity reaching a plot fails here instead of being kept quiet)."""
    path = tmp_path / "synthetic.json"
    report.write_json(synthetic_gpu_document(), path)
    readme = tmp_path / "README.md"
    md = _render(capsys, path, tmp_path / "r", readme, "synthetic.json", "--debug")
    expect("synthetic-gpu.report.md", _without_images(md))
    expect("synthetic-gpu.readme.md", (tmp_path / "README.md").read_text())
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    written = _assert_plots(md, tmp_path / "r")
    # One speedup plot per baseline; "bf16 linear" is named without its space.
    assert written == {
        "roofline.png",
        "bandwidth_fwd.png",
        "accuracy.png",
        *(f"speedup_vs_{b}.png" for b in ("torch", "torch_compile", "liger", "cuda")),
        "speedup_vs_bf16_linear.png",
    }


def test_synthetic_interpreter_document_renders(tmp_path, capsys):
    """What the main job writes without a GPU: accuracy only, the shapes listed."""
    path = tmp_path / "interpreter.json"
    report.write_json(synthetic_interpreter_document(), path)
    md = _render(capsys, path, tmp_path / "r")
    expect("synthetic-interpreter.report.md", _without_images(md))
    assert "## Performance" not in md


def test_synthetic_regressions_are_caught(tmp_path, capsys):
    """regress: a slower case, a less accurate one and a newly failed check fail the gate
    (exit 1); a faster one is said; the same document against itself passes."""
    old = synthetic_gpu_document()
    new = synthetic_regression(old)
    old_path, new_path = tmp_path / "old.json", tmp_path / "new.json"
    report.write_json(old, old_path)
    report.write_json(new, new_path)
    out = _regress(capsys, new_path, old_path, 1)
    for status in ("SLOWER", "LESS ACCURATE", "FAILED CHECK", "| faster |"):
        assert status in out, status
    expect("synthetic-gpu.regress.md", out)
    assert _regress(capsys, old_path, old_path, 0).rstrip().endswith("no regression beyond 10%")
