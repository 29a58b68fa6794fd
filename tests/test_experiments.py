"""The scripts in experiments/ still name what tritonkit has.

They run only on a GPU or with ptxas, so nothing else notices when a refactor renames a
module, a kernel or a config they use: two of them went stale that way (they imported
pre-package names). Each script is read, not run: every ``from tritonkit... import name``
must resolve, and every attribute taken of an imported tritonkit module or object
(``N.norm_bwd_kernel``) must exist.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
SCRIPTS = sorted(EXPERIMENTS.glob("*.py"))


def _resolve(module: str, name: str):
    """``from module import name``: an attribute of the module, or its submodule."""
    mod = importlib.import_module(module)
    if hasattr(mod, name):
        return getattr(mod, name)
    return importlib.import_module(f"{module}.{name}")


def _missing(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    bound: dict[str, object] = {}  # local name -> the tritonkit object it names
    missing = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tritonkit"):
            for alias in node.names:
                try:
                    bound[alias.asname or alias.name] = _resolve(node.module, alias.name)
                except (ImportError, AttributeError):
                    missing.append(f"line {node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "tritonkit":
                    continue
                try:
                    module = importlib.import_module(alias.name)
                except ImportError:
                    missing.append(f"line {node.lineno}: import {alias.name}")
                    continue
                if alias.asname:
                    bound[alias.asname] = module
                else:
                    bound["tritonkit"] = importlib.import_module("tritonkit")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and isinstance(node.ctx, ast.Load)
        ):
            owner = bound[node.value.id]
            if hasattr(owner, node.attr):
                continue
            try:  # a submodule not yet imported
                importlib.import_module(f"{owner.__name__}.{node.attr}")
            except (ImportError, AttributeError, TypeError):
                missing.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return missing


def test_there_are_scripts():
    assert len(SCRIPTS) >= 5, SCRIPTS


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_names_exist(path):
    assert _missing(path) == []


def test_a_stale_name_is_caught(tmp_path):
    stale = tmp_path / "stale.py"
    stale.write_text(
        "from tritonkit.ops import norm as N\n"
        "from tritonkit.ops.norm import no_such_kernel\n"
        "N._norm_fwd_kernel\n"
    )
    found = _missing(stale)
    assert len(found) == 2 and "no_such_kernel" in found[0] and "N._norm_fwd_kernel" in found[1]


def test_the_h100_matmul_table_is_the_tune_logs_winners(tmp_path, monkeypatch):
    """The shipped H100 matmul/linear table came back from the GPU as a tune log only; rebuilt
    from that log (ship_from_tune_log.py, run here on the committed log into a scratch folder)
    it is entry for entry the committed table: the log's last winner of each key."""
    import importlib.util
    import json

    from tritonkit import _tuning

    spec = importlib.util.spec_from_file_location("ship", EXPERIMENTS / "ship_from_tune_log.py")
    ship = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ship)
    root = Path(__file__).resolve().parents[1]
    log = root / "benchmarks/results/nvidia-h100/session-2026-11-27/tune-matmul-decode.log"
    gpu = "NVIDIA H100 80GB HBM3"
    committed = json.loads((_tuning.shipped_dir(gpu) / "matmul.json").read_text())["entries"]
    monkeypatch.setattr(_tuning, "SHIPPED_DIR", tmp_path)
    monkeypatch.setattr(
        "sys.argv",
        ["ship", str(log), "--gpu", gpu, "--profile", "NVIDIA H100 SXM", "--family", "matmul"],
    )
    ship.main()
    rebuilt = json.loads((tmp_path / _tuning._slug(gpu) / "matmul.json").read_text())["entries"]
    assert rebuilt == committed
    found = ship.tunings(log.read_text())
    assert len(found) == 132 and len(committed) == 57


def test_conv_paths_report_renders_the_recorded_gpu_runs():
    """gpu_conv_paths.py's report from the H200 runs committed under benchmarks/results, and
    from a row whose GPU timing could not be captured (None): the table, not a crash."""
    import copy
    import json
    import sys

    sys.path.insert(0, str(EXPERIMENTS))
    try:
        import gpu_conv_paths
    finally:
        sys.path.remove(str(EXPERIMENTS))
    results = EXPERIMENTS.parent / "benchmarks" / "results" / "nvidia-h200"
    files = sorted(results.glob("session-*/conv-paths*.json"))
    assert files
    for path in files:
        doc = json.loads(path.read_text())
        md = gpu_conv_paths.render(doc)
        assert "NVIDIA H200" in md and md.count("\n| ") >= len(doc["layers"])
    layer = next(iter(doc["layers"].values()))
    broken = copy.deepcopy(doc)
    first = next(iter(broken["layers"].values()))
    first["gpu_ms"] = None
    next(iter(first["best"].values()))["gpu_ms"] = None
    md = gpu_conv_paths.render(broken)
    assert f"| {layer['shape']} | - |" in md


def test_dist_summary_renders_the_recorded_gpu_runs(tmp_path, monkeypatch):
    """gpu_dist.py's summary (written only after a GPU run) from the runs committed under
    benchmarks/results: 4 x H200 at worlds 2 and 4 with the host and auto columns, and an
    older 2 x H200 run without them (rendered as nan, not a crash)."""
    import json
    import shutil

    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    import gpu_dist

    results = EXPERIMENTS.parent / "benchmarks" / "results" / "nvidia-h200"
    runs = {
        2: results / "session-2026-11-28-e" / "dist-x4-w2.json",
        4: results / "session-2026-11-28-e" / "dist-x4-w4.json",
        3: results / "session-2026-11-28-c" / "dist-x2-w2-latency-agmm.json",
    }
    for world, path in runs.items():
        (tmp_path / f"w{world}").mkdir()
        shutil.copy(path, tmp_path / f"w{world}" / f"dist_w{world}.json")
    monkeypatch.setattr(gpu_dist, "OUT", tmp_path)
    md = gpu_dist.summary([2, 4, 3, 8])
    assert "## world 8: no results" in md
    assert md.count("correct: all_passed=True") == 3
    for world in (2, 4):
        lat = json.loads(runs[world].read_text())["sections"]["latency"]["rows"]
        first = lat[0]
        row = (
            f"| 1K | {first['ours_us']:.1f} | {first['one_shot_us']:.1f} | "
            f"{first['two_shot_us']:.1f} | {first['torch_one_shot_us']:.1f} |"
        )
        assert row in md
        host = f"| {first['ours_host_us']:.1f}, {first['torch_one_shot_host_us']:.1f} |"
        assert host + f" {first['auto_us']:.1f} |" in md
    assert "| nan, nan | nan |" in md  # the older run: no host or auto timings


def test_weight_only_decode_report_renders_the_recorded_gpu_run(monkeypatch):
    """gpu_weight_only_decode.py's table from the H200 run committed under benchmarks/results
    (written only after a GPU run): byte for byte the committed Markdown."""
    monkeypatch.syspath_prepend(str(EXPERIMENTS))
    import json

    import gpu_weight_only_decode

    run = EXPERIMENTS.parent / "benchmarks" / "results" / "nvidia-h200" / "session-2026-11-28-e"
    doc = json.loads((run / "weight_only_decode.json").read_text())
    md = gpu_weight_only_decode.render(doc)
    assert md == (run / "weight_only_decode.md").read_text()
    assert md.count("\n| 8192 x 8192 |") == 3 and "NVIDIA H200" in md
