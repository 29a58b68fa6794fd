"""The persistent autotune cache: search, storage, concurrency, corruption, cross-process hits."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tritonkit import _tuning
from tritonkit._tuning import Config

MACHINE = ("Fake GPU 9000", "3.6.0")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(_tuning.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(_tuning, "_memory", {})
    return tmp_path


def _configs(*blocks):
    return [Config({"BLOCK": b}, 4, 2) for b in blocks]


def _fake_timer(run, c):
    return abs(c.params["BLOCK"] - 128) + 1.0  # best at 128


def test_search_picks_the_fastest_and_prunes():
    best, tried = _tuning.search(_configs(32, 128, 512), None, timer=_fake_timer)
    assert best.params["BLOCK"] == 128 and len(tried) == 3
    best, tried = _tuning.search(
        _configs(32, 128, 512), None, timer=_fake_timer, prune=lambda c: c.params["BLOCK"] < 100
    )
    assert best.params["BLOCK"] == 32 and len(tried) == 1
    with pytest.raises(ValueError, match="every candidate config was pruned"):
        _tuning.search(_configs(32), None, timer=_fake_timer, prune=lambda c: False)


def test_hierarchical_search_walks_to_a_better_neighbour():
    def neighbours(c):
        b = c.params["BLOCK"]
        return _configs(b // 2, b * 2)

    best, tried = _tuning.search(_configs(16, 512), None, neighbours=neighbours, timer=_fake_timer)
    assert best.params["BLOCK"] == 128
    assert len(tried) < 8  # coarse points plus a short walk, not a full grid


def test_failed_configs_are_skipped():
    def timer(run, c):
        return None if c.params["BLOCK"] == 128 else float(c.params["BLOCK"])

    best, tried = _tuning.search(_configs(64, 128, 256), None, timer=timer)
    assert best.params["BLOCK"] == 64 and (Config({"BLOCK": 128}, 4, 2), None) in tried


def test_store_then_lookup(cache):
    assert _tuning.lookup("k", {"n": 1}, MACHINE) is None
    _tuning.store("k", {"n": 1}, Config({"BLOCK": 64}, 8, 3), [], MACHINE)
    _tuning._memory.clear()
    assert _tuning.lookup("k", {"n": 1}, MACHINE) == Config({"BLOCK": 64}, 8, 3)
    doc = json.loads(_tuning.cache_path(MACHINE).read_text())
    assert doc["gpu"] == MACHINE[0] and doc["triton"] == MACHINE[1]


def test_corrupt_cache_is_ignored_with_a_warning_and_rewritten(cache):
    path = _tuning.cache_path(MACHINE)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"schema": 1, "gpu": "Fake GPU 9000", "entr')
    with pytest.warns(UserWarning, match="corrupt"):
        assert _tuning.lookup("k", {"n": 1}, MACHINE) is None
    with pytest.warns(UserWarning, match="corrupt"):
        _tuning.store("k", {"n": 1}, Config({"BLOCK": 32}), [], MACHINE)
    assert json.loads(path.read_text())["schema"] == 1


def test_foreign_cache_is_ignored(cache):
    path = _tuning.cache_path(MACHINE)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": 1, "gpu": "Other", "triton": "1.0", "entries": {}}))
    with pytest.warns(UserWarning, match="not for this machine"):
        assert _tuning.lookup("k", {"n": 1}, MACHINE) is None


_WRITER = textwrap.dedent(
    """
    import sys
    from tritonkit import _tuning
    machine = ("Fake GPU 9000", "3.6.0")
    tag = sys.argv[1]
    for i in range(40):
        _tuning.store("k", {"writer": tag, "i": i}, _tuning.Config({"BLOCK": i}), [], machine)
    """
)


@pytest.mark.slow
def test_two_processes_writing_at_once_lose_nothing(cache):
    env = {**os.environ, _tuning.CACHE_ENV: str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, tag], env=env) for tag in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    doc = json.loads(_tuning.cache_path(MACHINE).read_text())
    assert len(doc["entries"]) == 80


_TUNER = textwrap.dedent(
    """
    import json
    from tritonkit import _tuning
    _tuning.enabled = _tuning.consulted = lambda: True
    _tuning._machine = lambda: ("Fake GPU 9000", "3.6.0")
    timed = []
    def timer(run, c):
        timed.append(c)
        return abs(c.params["BLOCK"] - 128) + 1.0
    _tuning._time_config = timer
    cands = [_tuning.Config({"BLOCK": b}) for b in (32, 128, 512)]
    best = _tuning.tune("kern", {"n": 4096}, cands, run=lambda c: None)
    print(json.dumps({"best": best.params["BLOCK"], "timed": len(timed),
                      "tunings": _tuning.STATS.tunings, "hits": _tuning.STATS.hits}))
    """
)


@pytest.mark.slow
def test_second_process_hits_the_cache_and_times_nothing(cache):
    env = {**os.environ, _tuning.CACHE_ENV: str(cache)}

    def run():
        out = subprocess.run(
            [sys.executable, "-c", _TUNER], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    first, second = run(), run()
    assert first == {"best": 128, "timed": 3, "tunings": 1, "hits": 0}
    assert second == {"best": 128, "timed": 0, "tunings": 0, "hits": 1}


def test_interpreter_uses_the_default_without_timing(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")

    def boom(run, c):
        raise AssertionError("must not time under the interpreter")

    monkeypatch.setattr(_tuning, "_time_config", boom)
    cands = _configs(64, 128)
    assert _tuning.tune("kern", {"n": 1}, cands, run=lambda c: None) is cands[0]


@pytest.fixture
def gpu(cache, tmp_path, monkeypatch):
    """A fake GPU with tuning consulted, and an empty directory of shipped tables."""
    monkeypatch.setattr(_tuning, "SHIPPED_DIR", tmp_path / "tuned")
    monkeypatch.setattr(_tuning, "_shipped", {})
    monkeypatch.setattr(_tuning, "consulted", lambda: True)
    monkeypatch.setattr(_tuning, "enabled", lambda: True)
    monkeypatch.setattr(_tuning, "_machine", lambda: MACHINE)
    monkeypatch.setattr(_tuning, "STATS", _tuning.Stats())
    monkeypatch.delenv(_tuning.AUTOTUNE_ENV, raising=False)
    monkeypatch.delenv(_tuning.FORCE_ENV, raising=False)
    timed = []

    def timer(run, c):
        timed.append(c)
        return _fake_timer(run, c)

    monkeypatch.setattr(_tuning, "_time_config", timer)
    return timed


def _ship(best, key=None, machine=MACHINE):
    t = _tuning.Tuning("kern", key or {"n": 1}, best, [], 0.0)
    return _tuning.write_shipped("fam", [t], machine)


def test_a_shipped_config_is_used_without_timing(gpu, monkeypatch):
    path = _ship(Config({"BLOCK": 512}, 4, 2))
    doc = json.loads(path.read_text())
    assert doc["gpu"] == MACHINE[0] and doc["triton"] == MACHINE[1] and doc["family"] == "fam"
    cands = _configs(32, 128, 512)
    assert _tuning.tune("kern", {"n": 1}, cands, run=lambda c: None) == cands[2]
    assert gpu == [] and _tuning.STATS.shipped == 1
    # A key the table lacks, on a GPU that has one: the heuristic default, nothing timed.
    assert _tuning.tune("kern", {"n": 2}, cands, run=lambda c: None) is cands[0]
    # A shipped config the kernel no longer offers is not launched.
    assert _tuning.tune("kern", {"n": 1}, _configs(32, 128), run=lambda c: None).params == {
        "BLOCK": 32
    }
    assert gpu == []
    # TRITONKIT_AUTOTUNE=0: still the table (never timed); =1: tuned here, the table ignored.
    monkeypatch.setenv(_tuning.AUTOTUNE_ENV, "0")
    assert _tuning.tune("kern", {"n": 1}, cands, run=lambda c: None) == cands[2]
    monkeypatch.setenv(_tuning.AUTOTUNE_ENV, "1")
    assert _tuning.tune("kern", {"n": 1}, cands, run=lambda c: None) == cands[1]
    assert len(gpu) == 3


def test_an_unknown_gpu_tunes_within_its_budget_or_takes_the_heuristic(gpu, monkeypatch):
    _ship(Config({"BLOCK": 512}, 4, 2), machine=("Another GPU", "3.6.0"))
    cands = _configs(32, 128, 512)
    monkeypatch.setenv(_tuning.AUTOTUNE_ENV, "0")
    assert _tuning.tune("kern", {"n": 1}, cands, run=lambda c: None) is cands[0]
    assert gpu == []
    monkeypatch.delenv(_tuning.AUTOTUNE_ENV)
    monkeypatch.setenv(_tuning.BUDGET_ENV, "0")  # out of time after the first config
    assert _tuning.tune("kern", {"n": 1}, cands, run=lambda c: None) is cands[0]
    assert gpu == [cands[0]]
    monkeypatch.delenv(_tuning.BUDGET_ENV)
    assert _tuning.tune("kern", {"n": 3}, cands, run=lambda c: None) == cands[1]
    assert len(gpu) == 4


def test_a_bad_shipped_table_is_ignored_with_a_warning(gpu):
    path = _ship(Config({"BLOCK": 512}, 4, 2))
    path.write_text("{not json")
    with pytest.warns(UserWarning, match="shipped table"):
        assert not _tuning.has_shipped_table()


def _expected_params():
    """Each tuned kernel's parameter names, from its own configs."""

    from tritonkit.ops.attention.config import INTERPRETER_DECODE, INTERPRETER_FWD
    from tritonkit.ops.collectives.config import SYMM_TABLE_KERNEL
    from tritonkit.ops.conv.config import DepthwiseConfig, GemmConfig, WgradConfig
    from tritonkit.ops.matmul.configs import MatmulConfig
    from tritonkit.ops.matmul.decode import DecodeGemmConfig
    from tritonkit.ops.optim.config import CHUNK_CANDIDATES, CHUNKS_KERNEL, DEFAULT_NS, NS_KERNEL
    from tritonkit.ops.quant.config import WeightOnlyConfig

    tile = set(INTERPRETER_FWD.tuning().params)
    matmul = set(MatmulConfig(16, 16, 16).tuning().params)
    weight_only = set(WeightOnlyConfig(16, 64, 256, 1, 4, 2).to_tuning().params)
    gemm = set(GemmConfig().tuning().params)
    return {
        "matmul": matmul,
        "attention_fwd": tile,
        "attention_bwd_dq": tile,
        "attention_bwd_dkdv": tile,
        "attention_decode": set(INTERPRETER_DECODE.tuning().params),
        "transpose": {"BLOCK_M", "BLOCK_N"},
        "int8_weight_only": weight_only,
        "matmul_decode": set(DecodeGemmConfig().tuning().params),
        NS_KERNEL: set(DEFAULT_NS.tuning().params),
        # the measured symmetric-memory crossover (collectives/config.py: symm_crossover)
        SYMM_TABLE_KERNEL: {"max_bytes", "one_shot_max_bytes"},
        CHUNKS_KERNEL: set(CHUNK_CANDIDATES[0].tuning().params),
        **dict.fromkeys(
            ("conv_fwd", "conv_tma", "conv_1x1", "conv_1x1-tma", "conv_rows", "conv_dgrad"), gemm
        ),
        "conv_wgrad": set(WgradConfig().tuning().params),
        "conv_depthwise": set(DepthwiseConfig().tuning().params),
    }


def test_the_packages_shipped_tables_load_and_match_the_kernels():
    """Every shipped table parses, names its GPU, Triton version and family, and holds configs
    whose parameters are those of a kernel that tunes (none shipped: nothing to hold)."""

    expected = _expected_params()
    files = sorted(Path(_tuning.__file__).parent.glob("tuned/*/*.json"))
    for path in files:
        doc = _tuning.read_shipped(path)
        # a family package of ops/ (quant and optim have no flat functions in FAMILIES)
        family_dir = Path(_tuning.__file__).parent / "ops" / doc["family"]
        assert family_dir.is_dir() and path.stem == doc["family"], path
        assert path.parent.name == _tuning._slug(doc["gpu"]), path
        for entry_key, entry in doc["entries"].items():
            kernel = entry_key.split("|", 1)[0]
            assert kernel in expected, f"{path}: {kernel} is not a tuned kernel"
            params = set(Config.from_dict(entry["config"]).params)
            assert params == expected[kernel], f"{path}: {entry_key}: {params}"
