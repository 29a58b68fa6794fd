"""Which public calls replay from C++ in a steady loop, and why not where they do not: each
of the host-time cases at (64, 3000) bf16 called eight times after the replay extension is
ready, then replay.STATS (recordings, failures with their reasons) and, per case, whether the
last call's key holds a C++ plan; and the host cost of the Env snapshot on this machine.

    PYTHONPATH=src python experiments/gpu_replay_keys.py
"""

from __future__ import annotations

import json
import sys
import timeit
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import host_overhead as H

from tritonkit.ops._core import plan, replay


def main() -> None:
    replay.extension(wait=True)
    cases = H._cases()
    out: dict = {}
    for name in [
        "rms_norm fwd", "rms_norm fwd+bwd", "layer_norm fwd", "softmax fwd", "gelu fwd",
        "gelu fwd+bwd", "cross_entropy fwd", "cross_entropy fwd+bwd",
    ]:  # fmt: skip
        before = (replay.STATS.recordings, dict(replay.STATS.failures), replay.STATS.replays)
        fn = cases[name]["tritonkit"]
        for _ in range(8):
            fn()
        torch.cuda.synchronize()
        out[name] = {
            "recordings": replay.STATS.recordings - before[0],
            "replays": replay.STATS.replays - before[2],
            "new failures": {
                k: v - before[1].get(k, 0)
                for k, v in replay.STATS.failures.items()
                if v != before[1].get(k, 0)
            },
        }
        print(name, out[name], flush=True)
    n = 20000
    out["env us"] = timeit.timeit(plan.current_env, number=n) / n * 1e6
    out["precision us"] = timeit.timeit(torch.get_float32_matmul_precision, number=n) / n * 1e6
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
