"""The README's tour runs as written: its Python snippets, in order, in a fresh interpreter.

Here (no GPU) they take the interpreter path the snippets choose themselves (`device` is
"cpu", TRITON_INTERPRET set before tritonkit loads); on a GPU machine they run on it. No
warning of the libraries' may reach the user along the way.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tour_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("## A short tour\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end], re.S)


def test_readme_tour_runs_as_written(tmp_path):
    blocks = tour_blocks()
    assert len(blocks) >= 2 and all("device=device" in b or "device" in b for b in blocks)
    assert 'device = "cuda" if torch.cuda.is_available() else "cpu"' in blocks[0]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the snippet sets it
    env["PYTHONPATH"] = str(ROOT / "src")
    env["TRITONKIT_CACHE_DIR"] = str(tmp_path / "cache")
    proc = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", "\n".join(blocks)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not re.search(r"\w+Warning:", proc.stderr), proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0].endswith("True"), proc.stdout
