"""The command line, as a user runs it: on the GPU where there is one, else under Triton's
CPU interpreter (the tests that hold only without a GPU say so with NO_GPU)."""

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tritonkit.cli import main
from tritonkit.harness import report
from tritonkit.harness.progress import Progress

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(capsys, argv, *needles: str) -> str:
    """Exit code 2, one line on stderr holding every needle, no traceback, nothing on stdout."""
    code, out, err = run(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err and out == "", (out, err)
    assert lines[0].startswith("tritonkit: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_list_shows_the_family(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("relu", "gelu", "silu", "add", "bias_act", "swiglu", "geglu", "copy", "transpose"):
        assert f"| {name} |" in out


def test_version(capsys):
    import triton

    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.strip() == (
        f"tritonkit 0.1.0 (torch {torch.__version__}, triton {triton.__version__})"
    )


# Each CLI error: the arguments, then what its one line must say (the problem, the valid choices).
ERRORS = {
    "no command": ([], ["required", "check", "bench", "report"]),
    "unknown command": (["chek"], ["invalid choice: 'chek'", "'check'"]),
    "unknown operator": (
        ["check", "gelux"],
        ["unknown operator 'gelux'", "did you mean 'gelu'", "known operators:", "tritonkit list"],
    ),
    "unknown operator in list": (["list", "nope"], ["unknown operator 'nope'", "relu"]),
    "unknown dtype": (
        ["check", "relu", "--dtypes", "foo"],
        ["unknown dtype 'foo'", "float32", "int8", "float8_e4m3fn", "bf16", "fp8"],
    ),
    "dtype selects nothing": (
        ["check", "relu", "--dtypes", "int8"],
        ["nothing to run", "int8", "relu: float32, float16, bfloat16"],
    ),
    "check shapes": (["check", "relu", "--shapes", "huge"], ["--shapes", "'test'", "'bench'"]),
    "seed not a number": (["check", "relu", "--seed", "x"], ["--seed", "'x'"]),
    "negative seed": (["check", "relu", "--seed", "-1"], ["--seed", "-1"]),
    "json in a missing directory": (
        ["check", "relu", "--json", "/nonexistent-dir/x.json"],
        ["--json", "/nonexistent-dir", "does not exist"],
    ),
    "unknown mode": (
        ["bench", "relu", "--mode", "fwd,bwdd"],
        ["unknown mode 'bwdd'", "fwd, bwd, fwd+bwd", "all"],
    ),
    "bad shape": (["bench", "relu", "--shapes", "(3,"], ["--shapes", "'(3,'", "test, bench"]),
    "unknown baseline": (
        ["bench", "relu", "--baselines", "torchh"],
        ["unknown baseline 'torchh'", "torch, torch.compile"],
    ),
    "bench dtype selects nothing": (
        ["bench", "matmul", "--dtypes", "fp8"],
        ["nothing to run", "float8_e4m3fn", "matmul: float32"],
    ),
    "unknown profile": (
        ["--profile", "nvidia-h9", "doctor"],
        ["'nvidia-h9'", "known GPUs:", "NVIDIA H200", "bandwidth=0.7"],
    ),
    "bad profile factor": (["--profile", "bandwidth=fast", "doctor"], ["bandwidth", "'fast'"]),
    # Every command checks --profile, also those that do not use it.
    "unknown profile, list": (
        ["--profile", "no_such_gpu", "list"],
        ["'no_such_gpu'", "known GPUs:", "NVIDIA H100 SXM", "NVIDIA H200"],
    ),
    "tune dtype": (["tune", "relu", "--dtypes", "fp64"], ["unknown dtype 'fp64'", "float32"]),
    "tune shape": (["tune", "relu", "--shapes", "big"], ["--shapes", "'big'"]),
    "threshold": (
        ["regress", "a.json", "--against", "b.json", "--threshold", "-1"],
        ["--threshold", "-1", "0.10"],
    ),
    "regress missing file": (
        ["regress", "/nonexistent/new.json", "--against", "/nonexistent/old.json"],
        ["/nonexistent/new.json does not exist", "/nonexistent/old.json does not exist"],
    ),
    "regress missing file, no --against": (
        ["regress", "/nonexistent/a.json"],
        ["/nonexistent/a.json does not exist", "--against OLD.json is required"],
    ),
    "report missing file": (["report", "/nonexistent/r.json"], ["/nonexistent/r.json", "exist"]),
}


@pytest.mark.parametrize("argv, needles", ERRORS.values(), ids=ERRORS.keys())
def test_error_is_one_line_exit_2(capsys, argv, needles):
    assert_one_line_error(capsys, argv, *needles)


def test_unknown_operator_lists_every_name(capsys):
    """The valid names in full, however many there are (never cut with "...")."""
    from tritonkit.harness.spec import all_specs

    line = assert_one_line_error(capsys, ["bench", "no_such_op"], "unknown operator 'no_such_op'")
    assert "..." not in line
    for s in all_specs():
        assert s.name in line and s.family in line, s.name


@NO_GPU
def test_errors_without_a_gpu(capsys):
    assert_one_line_error(capsys, ["tune", "relu"], "needs a CUDA GPU")
    assert_one_line_error(capsys, ["bench", "relu", "--no-check"], "nothing to run", "--no-check")


@NO_GPU
@pytest.mark.parametrize(
    "argv",
    [
        ["check", "relu", "--shapes", "bench"],
        ["check", "relu", "--shapes", "BENCH"],
        ["bench", "relu", "--shapes", "bench"],
        ["bench", "relu", "--shapes", "(4096, 4096)"],
    ],
)
def test_bench_shapes_on_the_cpu_ask_first(capsys, argv, monkeypatch):
    # Not a terminal (as under pytest): no question can be asked, so the run needs --yes.
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    line = assert_one_line_error(capsys, argv, "pass --yes", "under Triton's CPU interpreter")
    assert "take roughly" in line and any(ch.isdigit() for ch in line.split("roughly")[1])


def test_profile_names_are_case_insensitive(capsys):
    for name in ("h200", "NVIDIA h200", "nvidia a100 80gb"):
        code, out, err = run(capsys, "--profile", name, "doctor")
        assert code == 0, err
        assert "profile: NVIDIA" in out


def test_report_names_the_malformed_file_and_why(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    assert_one_line_error(capsys, ["report", str(bad)], str(bad), "not valid JSON")
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    assert_one_line_error(capsys, ["report", str(empty_dir)], str(empty_dir), "no results.json")
    doc = json.loads(json.dumps(_interpreter_results()))
    del doc["checks"][0]["op"]
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(doc))
    assert_one_line_error(capsys, ["report", str(broken)], str(broken), "checks[0]", "'op'")
    doc = _interpreter_results()
    doc["fingerprint"].pop("torch")
    broken.write_text(json.dumps(doc))
    assert_one_line_error(capsys, ["report", str(broken)], "fingerprint has no 'torch'")


def test_unexpected_failure_is_one_line_and_debug_shows_the_traceback(capsys, monkeypatch):
    from tritonkit import cli

    def boom(args):
        raise RuntimeError("something broke\nacross lines")

    monkeypatch.setattr(cli, "cmd_list", boom)
    line = assert_one_line_error(capsys, ["list"], "RuntimeError: something broke across lines")
    assert "--debug" in line
    code, _, err = run(capsys, "list", "--debug")
    assert code == 2 and "Traceback" in err and "something broke" in err


def _stderr_of(*argv: str) -> str:
    """stderr of ``python -m tritonkit ARGV`` run as a user runs it: a fresh process, outside
    pytest's warning capture; exit 0 and the summary on stdout asserted."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    cmd = [sys.executable, "-m", "tritonkit", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "checks passed" in proc.stdout
    assert "Warning" not in proc.stdout, proc.stdout
    return proc.stderr


def _warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if re.search(r"warn", line, re.IGNORECASE)]


def test_no_library_warnings_in_the_output(tmp_path):
    """The main job, as users run it, says nothing but tritonkit's own lines on stderr. Under
    the interpreter NumPy warns about the NaN and inf the checks inject; on a GPU the
    torch.compile baselines (Dynamo's graph breaks, its recompile limit) and torch sparse's
    ("Sparse CSR tensor support is in beta") speak."""
    out = str(tmp_path / "r")
    argv = ["bench", "gelu", "spmv", "--dtypes", "fp32", "--mode", "fwd", "--out", out]
    stderr = _stderr_of(*argv, "--seed", "3")
    assert _warning_lines(stderr) == [], stderr
    ours = ("bench", "check", "compile", "tritonkit: ")
    assert all(line.startswith(ours) or not line.strip() for line in stderr.splitlines()), stderr


def test_quiet_keeps_library_warnings_and_logs_off_stderr(capsys):
    """The mechanism, on the noise seen on GPUs: PyTorch's C++ warning relayed to the tritonkit
    line that called it, Dynamo's log records (its loggers have handlers of their own: what
    reaches them is recorded here); tritonkit's own warnings stay, one line each. ``--debug``
    lets everything through, and leaving restores the loggers' levels."""
    import io
    import logging
    import warnings

    from tritonkit.cli import _quiet

    loggers = [logging.getLogger(n) for n in ("torch._dynamo.convert_frame", "torch._dynamo")]
    levels = [lg.level for lg in loggers]
    seen = io.StringIO()
    handler = logging.StreamHandler(seen)

    def noise() -> None:
        warnings.warn_explicit(
            "Sparse CSR tensor support is in beta state.",
            UserWarning,
            filename=str(Path(__file__).parents[1] / "src/tritonkit/ops/sparse/formats.py"),
            lineno=347,
            module="tritonkit.ops.sparse.formats",
        )
        loggers[0].warning("torch._dynamo hit config.recompile_limit (8)")
        loggers[1].warning("Graph break from `Tensor.item()`")
        warnings.warn("tritonkit: autotune cache x.json is corrupt; ignoring it", stacklevel=1)

    for lg in loggers:
        lg.addHandler(handler)
    try:
        capsys.readouterr()
        with _quiet(False):
            noise()
        err = capsys.readouterr().err
        assert err.splitlines() == [
            "tritonkit: warning: autotune cache x.json is corrupt; ignoring it"
        ]
        assert seen.getvalue() == ""
        assert [lg.level for lg in loggers] == levels
        with pytest.warns(UserWarning) as caught, _quiet(True):
            noise()
        assert "recompile_limit" in seen.getvalue() and "Graph break" in seen.getvalue()
        assert "Sparse CSR tensor support is in beta state." in {str(w.message) for w in caught}
    finally:
        for lg in loggers:
            lg.removeHandler(handler)


def test_check_one_operator(capsys):
    code, out, err = run(capsys, "check", "relu", "--dtypes", "fp32", "--seed", "5")
    assert code == 0
    assert "checks passed" in out
    assert err.startswith("checking 1 operator on ")
    assert "relu: " in err and "passed" in err  # the progress line of the operator


def test_check_accepts_the_dtypes_list_shows(capsys):
    code, out, _ = run(capsys, "check", "int8_matmul", "--dtypes", "INT8", "--seed", "2")
    assert code == 0 and "| int8_matmul | int8 |" in out


@NO_GPU
def test_bench_without_gpu_checks_and_says_so(tmp_path, capsys):
    out_dir = tmp_path / "rep"
    code, out, _ = run(
        capsys, "bench", "copy", "--dtypes", "fp32", "--out", str(out_dir), "--seed", "1"
    )
    assert code == 0
    assert "Timings need a CUDA GPU" in out
    results = json.loads((out_dir / "results.json").read_text())
    assert results["kind"] == "interpreter" and results["bench"] == []
    assert results["checks"] and all(c["passed"] for c in results["checks"])
    md = (out_dir / "report.md").read_text()
    assert "Timings need a GPU" in md and "measure nothing of the GPU" in md
    assert "## Performance" not in md and "How to read it" not in md  # GPU-only sections
    # the shape checked is listed, one that can show an error (copy is exact, as PyTorch is);
    # 6 cases: random, mixed, specials, constants, grad, empty
    assert "| copy | float32 | (3, 129) | 6/6 | 0 | 1 |" in md, md
    from tritonkit.harness.plots import accuracy_rows  # what accuracy.png draws

    rows = accuracy_rows(results)
    assert rows and all(theirs is not None for _, _, theirs in rows), rows
    if _has_matplotlib():
        assert (out_dir / "accuracy.png").stat().st_size > 0 and "![accuracy]" in md

    # A second bench keeps the first report and writes beside it, saying so.
    code, out, err = run(capsys, "bench", "copy", "--dtypes", "fp32", "--out", str(out_dir))
    second = tmp_path / "rep-2"
    assert code == 0 and f"writing to {second}/" in err
    assert (second / "results.json").exists()
    assert json.loads((out_dir / "results.json").read_text()) == results
    # --force writes over it.
    code, _, err = run(
        capsys, "bench", "copy", "--dtypes", "fp32", "--out", str(out_dir), "--force"
    )
    assert code == 0 and "writing to" not in err and not (tmp_path / "rep-3").exists()
    assert json.loads((out_dir / "results.json").read_text())["seed"] != 1

    # report takes the directory and re-renders it in place.
    code, out, _ = run(capsys, "report", str(out_dir))
    assert code == 0 and str(out_dir / "report.md") in out


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _interpreter_results() -> dict:
    check = {
        "op": "add",
        "params": "",
        "shape": "(7,)",
        "dtype": "bfloat16",
        "case": "random",
        "passed": True,
        "max_abs": 0.01,
        "rel_l2": 1e-3,
        "torch_rel_l2": 0.0,
        "ratio": float("inf"),
        "seed": 1,
        "detail": "",
        "skipped": None,
    }
    return report.make_results(
        kind="interpreter",
        fingerprint={
            "torch": "2.13",
            "triton": "3.6",
            "python": "3.11",
            "git_commit": "abc",
            "date": "2026-01-01",
            "gpu": None,
        },
        ceilings=None,
        checks=[check],
        bench=[],
        seed=1,
        ops=["add"],
    )


def test_a_ratio_without_a_baseline_is_na_never_inf():
    md = report.render_markdown(json.loads(json.dumps(_interpreter_results())))
    assert not re.search(r"\binf\b", md)
    assert "| add | bfloat16 | (7,) | 1/1 | 0.001 | n/a |" in md
    from _synthetic import synthetic_record, synthetic_results

    record = synthetic_record()
    record["speedup"]["torch"] = float("inf")
    record["comparison"]["torch"].update(speedup=float("inf"), ci_high=float("inf"))
    bench = report.render_bench(synthetic_results([record])["bench"])
    assert not re.search(r"\binf\b", bench) and "n/a" in bench


def test_progress_estimates_what_is_left():
    now = [0.0]
    stream = io.StringIO()
    progress = Progress(4, "check", stream=stream, heartbeat=30, clock=lambda: now[0])
    assert progress.estimate_left() is None
    now[0] = 10.0
    progress.step("relu fp32 (7,) random")
    assert progress.estimate_left() == pytest.approx(30.0)
    assert stream.getvalue() == ""  # not a terminal: no line before the heartbeat
    now[0] = 45.0
    progress.step("relu fp32 (7,) slice")  # 35 s since the last line: a heartbeat
    assert "2/4 45s, ~45s left  relu fp32 (7,) slice" in stream.getvalue()
    progress.log("relu: 2/2 passed")
    assert stream.getvalue().splitlines()[-1].endswith("relu: 2/2 passed")
    progress.close()


def test_doctor_runs(capsys):
    assert main(["doctor"]) == 0
    assert "torch" in capsys.readouterr().out


def test_package_and_functional_export_the_same_functions():
    # Both lists derive from the families' __all__ (tritonkit.ops.FAMILIES): a family's
    # public function is in both, and nothing else is.
    import importlib

    import tritonkit
    from tritonkit import functional
    from tritonkit.ops import FAMILIES

    family_names = sorted(
        n for f in FAMILIES for n in importlib.import_module(f"tritonkit.ops.{f}").__all__
    )
    assert functional.__all__ == family_names
    assert tritonkit.__all__ == [*family_names, *tritonkit._SUBMODULES]
    assert {"functional", "nn", "optim", "quant", "sparse", "models"} <= set(tritonkit.__all__)
    for name in functional.__all__:
        assert getattr(tritonkit, name) is getattr(functional, name)
        assert callable(getattr(tritonkit, name)) and getattr(tritonkit, name).__doc__


def test_public_subpackages_are_attributes_of_the_package():
    """``import tritonkit as tk; tk.optim.AdamW`` works, and importing tritonkit stays lazy."""
    import subprocess
    import sys

    code = (
        "import sys, tritonkit as tk; "
        "assert 'tritonkit.optim' not in sys.modules and 'triton' not in sys.modules; "
        "assert tk.optim.AdamW and tk.optim.Muon and tk.quant.quantize and tk.nn.RMSNorm; "
        "assert tk.functional.gelu is tk.gelu"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_import_tritonkit_is_lazy():
    """``import tritonkit`` imports neither triton nor a family (a fresh interpreter)."""
    import subprocess
    import sys

    code = (
        "import sys, tritonkit; "
        "assert 'triton' not in sys.modules, 'triton'; "
        "assert not any(m.startswith('tritonkit.ops') for m in sys.modules), 'ops'; "
        "tritonkit.gelu; assert 'tritonkit.ops.elementwise' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_progress_with_a_cost_model_estimates_from_the_start():
    """With the run's expected seconds, the estimate is the model's before any case is done,
    then the model's for what is left scaled by how the cases done compared with it."""
    now = [0.0]
    progress = Progress(3, "bench", stream=io.StringIO(), clock=lambda: now[0], expected=100.0)
    assert progress.estimate_left() == pytest.approx(100.0)
    assert "~1m40s left" in progress.status()
    now[0] = 100.0  # the first case, expected to take 50 s, took 100: twice the model
    progress.step("a", 50.0)
    # 50 s of the model left, scaled by (100 + 2) / (50 + 2): the run's pace, shrunk a little
    # toward the model's
    assert progress.estimate_left() == pytest.approx(50.0 * 102 / 52)


# Operators whose spec has no test shape giving a check 256 elements to compare, in a spec file
# this test's owners may not change: the test fails when one gets one (then remove it here).
AWAITING_A_CHECK_SHAPE: dict[str, str] = {}


def test_the_main_jobs_checks_can_show_an_error():
    """The default selection checks every operator at a shape whose comparison has at least
    selection.MIN_CHECK_ELEMENTS elements in one tensor (an output or a gradient): never at the
    degenerate first test shapes ((1, 1), one number), which stay in the test suite."""
    import math

    from tritonkit.harness import selection
    from tritonkit.harness.spec import all_specs, get_spec

    assert selection.MIN_CHECK_ELEMENTS >= 256
    too_small = {}
    for it in selection.choose(all_specs(), full=False):
        (shape,) = it.check_shapes
        assert shape in it.spec.shapes.test, (it.spec.name, shape)
        compared = selection.compared_shapes(it.spec, shape, it.check_dtypes[0])
        largest = max((math.prod(d) for d in compared), default=0)
        if largest < selection.MIN_CHECK_ELEMENTS:
            too_small[it.spec.name] = (shape, largest)
    assert set(too_small) == set(AWAITING_A_CHECK_SHAPE), too_small
    # the degenerate shapes are still the test suite's
    assert get_spec("softmax").shapes.test[0] == (1, 1)
    assert get_spec("matmul").shapes.test[0] == (1, 1, 1)


def test_bench_selection_default_full_and_named():
    from tritonkit.harness import selection
    from tritonkit.harness.check import CASES
    from tritonkit.harness.spec import get_spec

    relu, matmul = get_spec("relu"), get_spec("matmul")
    default = selection.choose([relu, matmul], full=False)
    for it in default:
        assert len(it.check_dtypes) == 1 and it.bench_dtypes == it.check_dtypes
        assert len(it.check_shapes) == 1 and len(it.bench_shapes) == 1
        assert it.cases == selection.QUICK_CASES and not it.variants
    assert default[0].check_dtypes == (selection.main_dtype(relu),)
    full = selection.choose([relu, matmul], full=True, gpu=True)
    assert full[0].check_dtypes == tuple(relu.dtypes) and full[0].cases == CASES
    assert full[1].bench_shapes == tuple(matmul.shapes.bench) and full[1].variants
    assert selection.choose([matmul], full=False, named=True)[0].variants
    # dtypes and shapes asked for replace the selection's
    (it,) = selection.choose([relu], full=False, dtypes=[torch.float32], shapes=[(5, 7)])
    assert it.check_dtypes == (torch.float32,) and it.check_shapes == ((5, 7),)


def test_bench_says_its_estimate_before_it_starts(capsys, tmp_path):
    """Its first line: what it will run (the timings too, on a GPU) and how long that takes."""
    code = main(["bench", "relu", "--out", str(tmp_path / "r"), "--dtypes", "fp32"])
    err = capsys.readouterr().err
    assert code == 0
    first = err.splitlines()[0]
    timings = r" and \d+ timings" if torch.cuda.is_available() else ""
    pattern = rf"bench: \d+ checks{timings} of 1 operator \(.*\), about (\d+s|\d+m\d+s|\d+h\d+m)"
    assert re.fullmatch(pattern, first), first
    assert re.search(r"^bench: took .* \(estimated .* at the start\)$", err, re.MULTILINE), err


def test_full_runs_warm_tasks_cover_the_run_and_run_here():
    """bench --full's compile-ahead tasks: one per (operator, bench shape, dtype) and per
    (operator, check dtype); each runs in a worker as the run would call it (here in-process,
    under the interpreter, at test shapes)."""
    from tritonkit.harness import selection, warm
    from tritonkit.harness.spec import get_spec

    spec = get_spec("relu")
    (item,) = selection.choose([spec], full=False, dtypes=[torch.float32], shapes=[(5, 7)])
    tasks = warm.tasks([item], ("fwd", "fwd+bwd"), ["torch"], seed=0)
    assert [t[0] for t in tasks].count("bench") == len(item.bench_shapes)
    assert [t[0] for t in tasks].count("check") == 1
    assert warm.run_task(tasks[0]) is None and warm.run_task(tasks[-1]) is None
