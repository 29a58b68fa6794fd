"""The command line, as a user on a machine without a GPU runs it."""

import json

import pytest

from tritonkit.cli import main


def test_list_shows_the_family(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("relu", "gelu", "silu", "add", "bias_act", "swiglu", "geglu", "copy", "transpose"):
        assert f"| {name} |" in out


def test_unknown_operator_exits_2_and_lists_known(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["check", "gelux"])
    assert exc.value.code == 2
    assert "known operators:" in capsys.readouterr().err


def test_check_one_operator(capsys):
    assert main(["check", "relu", "--dtypes", "fp32", "--seed", "5"]) == 0
    assert "checks passed" in capsys.readouterr().out


def test_bench_without_gpu_checks_and_says_so(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out_dir = tmp_path / "rep"
    assert main(["bench", "copy", "--dtypes", "fp32", "--out", str(out_dir), "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "Timings need a CUDA GPU" in out
    results = json.loads((out_dir / "results.json").read_text())
    assert results["kind"] == "interpreter" and results["bench"] == []
    assert results["checks"] and all(c["passed"] for c in results["checks"])
    assert "Timings need a GPU" in (out_dir / "report.md").read_text()


def test_report_rejects_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    assert main(["report", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


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
    assert tritonkit.__all__ == [*family_names, "functional", "nn"]
    for name in functional.__all__:
        assert getattr(tritonkit, name) is getattr(functional, name)
        assert callable(getattr(tritonkit, name)) and getattr(tritonkit, name).__doc__


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
