"""Measurement you can trust: hardware profiles, the roofline, speedup statistics, the gate."""

import json

import numpy as np
import pytest

from tritonkit import _hardware
from tritonkit.cli import main
from tritonkit.harness import hardware, regress, report, roofline, stats

from _synthetic import synthetic_record, synthetic_results

# ---- hardware profiles -------------------------------------------------------------------------

VALID = {
    "name": "Toy GPU",
    "vendor": "nvidia",
    "compute_units": 10,
    "smem_per_block_kb": 48,
    "smem_per_unit_kb": 64,
    "registers_per_unit": 65536,
    "max_threads_per_block": 1024,
    "warp_size": 32,
    "dram_GBps": 500,
    "tflops": {"fp32": 10, "bf16": 100},
}


def test_known_table_covers_the_issue_and_ridge_points():
    for name in (
        "H100 SXM",
        "H100 PCIe",
        "H200",
        "A100 40GB",
        "A100 80GB",
        "L4",
        "L40S",
        "RTX 4090",
        "MI300X",
    ):
        assert any(name in k for k in _hardware.KNOWN), name
    h200 = _hardware.KNOWN["NVIDIA H200"]
    assert h200.ridge_point("bf16") == pytest.approx(989.4e12 / 4800e9)
    assert _hardware.match("NVIDIA H100 80GB HBM3").name == "NVIDIA H100 SXM"
    assert _hardware.match("NVIDIA H200").name == "NVIDIA H200"
    assert _hardware.KNOWN["AMD Instinct MI300X"].warp_size == 64


def test_valid_profile_loads(tmp_path):
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(VALID))
    p = _hardware.load(path)
    assert p.name == "Toy GPU" and p.peak("bf16") == 100 and p.source == str(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"warp_size": 48}, "'warp_size' must be 32 or 64, got 48"),
        ({"dram_GBps": -1}, "'dram_GBps' must be positive, got -1"),
        ({"compute_units": "many"}, "'compute_units' must be int, got 'many'"),
        ({"smem_per_block_kb": 100}, "must not exceed 'smem_per_unit_kb', got 100 > 64"),
        ({"tflops": {"bf16": 0}}, "'tflops.bf16' must be a positive number, got 0"),
        ({"color": "red"}, "unknown field"),
    ],
)
def test_invalid_profile_errors_name_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        _hardware.from_dict({**VALID, **change})


def test_missing_field_and_bad_files(tmp_path):
    with pytest.raises(ValueError, match="missing field"):
        _hardware.from_dict({k: v for k, v in VALID.items() if k != "dram_GBps"})
    with pytest.raises(ValueError, match="does not exist"):
        _hardware.load(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        _hardware.load(bad)


def test_profile_spec_scales_and_refuses_nonsense(tmp_path):
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(VALID))
    assert hardware.resolve_profile(str(path)).dram_GBps == 500
    assert hardware.resolve_profile("NVIDIA L4").dram_GBps == 300
    slow = _hardware.from_dict(VALID).scaled(bandwidth=0.7)
    assert slow.dram_GBps == pytest.approx(350) and slow.peak("bf16") == 100
    with pytest.raises(ValueError, match="scale factors like"):
        hardware.resolve_profile("speed=2")
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        hardware.resolve_profile("bandwidth=-1")


def test_simulated_profile_changes_pruning():
    from tritonkit import _tuning

    try:
        _hardware.set_active(_hardware.from_dict(VALID))  # 48 KB per block
        assert _tuning.fits_shared_memory(40 * 1024)
        assert not _tuning.fits_shared_memory(64 * 1024)
        _hardware.set_active(_hardware.KNOWN["NVIDIA H200"])  # 227 KB per block
        assert _tuning.fits_shared_memory(64 * 1024)
    finally:
        _hardware.set_active(None)


def test_doctor_shows_a_profile_without_a_gpu(tmp_path, capsys):
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(VALID))
    assert main(["--profile", str(path), "doctor"]) == 0
    out = capsys.readouterr().out
    assert "profile: Toy GPU" in out and "500 GB/s" in out


# ---- roofline ------------------------------------------------------------------------------------


def test_roofline_compute_bound_on_known_numbers():
    # 2 TFLOP and 1 GB in 10 ms on 1000 TFLOP/s and 4000 GB/s: the floor is 2 ms of compute.
    p = roofline.place(2e12, 1e9, 10.0, 4000, 1000)
    assert p.intensity == pytest.approx(2000)
    assert p.floor_ms == pytest.approx(2.0)
    assert p.pct_of_roofline == pytest.approx(20.0)
    assert p.bottleneck == "compute"
    assert p.bound_TFLOPs == pytest.approx(1000)  # min(1000, 2000 * 4 TB/s = 8000)
    assert p.achieved_TFLOPs == pytest.approx(200)


def test_roofline_memory_bound_on_known_numbers():
    # 1 GFLOP and 4 GB in 1.25 ms on 1000 TFLOP/s and 4000 GB/s: 1 ms of memory traffic.
    p = roofline.place(1e9, 4e9, 1.25, 4000, 1000)
    assert p.bottleneck == "memory"
    assert p.floor_ms == pytest.approx(1.0)
    assert p.pct_of_roofline == pytest.approx(80.0)
    assert p.achieved_GBps == pytest.approx(3200)
    assert p.bound_TFLOPs == pytest.approx(0.25 * 4000e9 / 1e12)


def test_roofline_refuses_nonsense():
    with pytest.raises(ValueError, match="time must be positive"):
        roofline.place(1, 1, 0, 1, 1)


# ---- statistics ----------------------------------------------------------------------------------


def _samples(mean, n=60, seed=0, spread=0.01):
    return list(np.random.default_rng(seed).normal(mean, spread * mean, n))


def test_speedup_interval_on_synthetic_samples():
    c = stats.compare(_samples(1.0, seed=1), _samples(1.2, seed=2))
    assert c.speedup == pytest.approx(1.2, rel=0.01)
    assert 1.0 < c.ci_low < 1.2 < c.ci_high < 1.25
    assert c.verdict == "faster" and c.p_value < 1e-6 and c.flag is None


def test_equal_distributions_are_no_significant_difference():
    c = stats.compare(_samples(1.0, seed=3), _samples(1.0, seed=4))
    assert c.ci_low < 1.0 < c.ci_high
    assert c.verdict == "no significant difference"
    assert c.p_value > 0.01


def test_slower_and_suspicious():
    assert stats.compare(_samples(1.1, seed=5), _samples(1.0, seed=6)).verdict == "slower"
    flagged = stats.compare(_samples(0.05, seed=7), _samples(1.0, seed=8))
    assert flagged.speedup > 10 and "above 10x" in flagged.flag


def test_outliers_are_removed_by_iqr():
    clean = stats.remove_outliers([1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 9.0])
    assert 9.0 not in clean and len(clean) == 6


# ---- regression gate -----------------------------------------------------------------------------


def _write(tmp_path, name, results):
    path = tmp_path / name
    report.write_json(results, path)
    return str(path)


def test_regress_exits_1_on_20_percent_and_0_on_5_percent(tmp_path, capsys):
    old = _write(tmp_path, "old.json", synthetic_results([synthetic_record(ours_ms=1.0)]))
    slow = _write(tmp_path, "slow.json", synthetic_results([synthetic_record(ours_ms=1.2)]))
    ok = _write(tmp_path, "ok.json", synthetic_results([synthetic_record(ours_ms=1.05)]))
    assert main(["regress", slow, "--against", old, "--threshold", "0.10"]) == 1
    assert "SLOWER" in capsys.readouterr().out
    assert main(["regress", ok, "--against", old, "--threshold", "0.10"]) == 0
    assert "no regression" in capsys.readouterr().out


def test_regress_catches_accuracy_loss(tmp_path):
    old = synthetic_results([synthetic_record(rel_l2=1e-3)])
    new = synthetic_results([synthetic_record(rel_l2=3e-3)])
    rows = regress.compare(new, old, 0.10)
    assert regress.failed(rows) and rows[0].status == "less accurate"


def test_regress_refuses_other_gpus_and_other_shapes(tmp_path, capsys):
    old = _write(tmp_path, "old.json", synthetic_results())
    other_gpu = _write(tmp_path, "gpu.json", synthetic_results(gpu="Other GPU"))
    other_shape = _write(
        tmp_path, "shape.json", synthetic_results([synthetic_record(shape="(4096, 4096)")])
    )
    assert main(["regress", other_gpu, "--against", old]) == 2
    assert "different GPUs" in capsys.readouterr().err
    assert main(["regress", other_shape, "--against", old]) == 2
    assert "different cases" in capsys.readouterr().err
