"""The persistent autotune cache: search, storage, concurrency, corruption, cross-process hits."""

import json
import os
import subprocess
import sys
import textwrap

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
    _tuning.enabled = lambda: True
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
