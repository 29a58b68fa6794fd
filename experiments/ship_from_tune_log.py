"""Rebuild a shipped tuning table from the log of ``tritonkit tune ... --ship`` (what it prints
per key: the timed configs and the winner), where the run wrote the table on the GPU machine
but was cut before the table came back.

    python experiments/ship_from_tune_log.py LOG --gpu "NVIDIA H100 80GB HBM3" \
        --profile "NVIDIA H100 SXM" --family matmul [--triton 3.6.0]

Each block ``  <kernel> {key}: N configs in S s`` and its ``<- best`` line become one entry,
merged into src/tritonkit/tuned/<gpu>/<family>.json as ``tune --ship`` merges them (a later
block of the same key wins). Nothing is timed here: the winners are the log's.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path
from unittest import mock

from tritonkit import _hardware, _tuning

BLOCK = re.compile(r"^  (\S+) (\{.*\}): \d+ configs in [\d.]+ s$")
BEST = re.compile(r"^\s+[\d.]+ ms  (.*)  <- best$")


def parse_config(text: str) -> _tuning.Config:
    fields = dict(item.split("=") for item in text.split())
    warps, stages = int(fields.pop("warps")), int(fields.pop("stages"))
    return _tuning.Config({k: int(v) for k, v in fields.items()}, warps, stages)


def tunings(log: str) -> list[_tuning.Tuning]:
    found, current = [], None
    for line in log.splitlines():
        if m := BLOCK.match(line):
            current = (m[1], ast.literal_eval(m[2]))
        elif (m := BEST.match(line)) and current is not None:
            found.append(_tuning.Tuning(current[0], current[1], parse_config(m[1]), [], 0.0))
            current = None
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log", type=Path)
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--profile", required=True, help="the hardware profile's name on that GPU")
    ap.add_argument("--family", required=True)
    ap.add_argument("--triton", default="3.6.0")
    args = ap.parse_args()
    found = tunings(args.log.read_text())
    profile = mock.Mock()
    profile.name = args.profile
    with mock.patch.object(_hardware, "active", return_value=profile):
        path = _tuning.write_shipped(args.family, found, (args.gpu, args.triton))
    print(f"{len(found)} winners from the log; {path}")


if __name__ == "__main__":
    main()
