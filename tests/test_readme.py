"""The README's commands, in order, as a new user runs them on a machine without a GPU.

A copy of the working tree (its tracked and unignored files) in a temporary directory, a shell
with no virtual environment and no TRITON_INTERPRET: command (a) exactly as the README writes
it (a fresh virtual environment, the pinned install, the main job), then the README's example
on CPU tensors in that environment, then command (b). The files and the plot the README says
(a) writes must appear, and each example must print what its comment says.

Command (b) runs the whole suite, this test included, which CI runs verbatim (.ci/run): here
it is collected only (every test module imports in the fresh environment), which keeps this
test to the install and the main job: 13.5 minutes on this project's 2-core machine while other
jobs shared it (the install from a local wheel mirror took about 6 of them).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
NESTED = "TRITONKIT_README_TEST"  # set in the commands' environment: no test runs itself

pytestmark = [
    pytest.mark.slow,
    pytest.mark.interpreter,  # the README's CPU path
    pytest.mark.skipif(bool(os.environ.get(NESTED)), reason="already inside the README's run"),
]

# What pip prints when it cannot reach a package index (no network, no local mirror).
OFFLINE = re.compile(
    r"No matching distribution found|Could not find a version that satisfies|"
    r"Failed to establish a new connection|Temporary failure in name resolution|"
    r"Network is unreachable|ProxyError|No route to host"
)


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else None]


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def fresh_shell_env(home: Path) -> dict[str, str]:
    """The environment of a new shell: no active virtual environment, no interpreter switch."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    active = os.environ.get("VIRTUAL_ENV") or str(Path(sys.executable).parent.parent)
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(active)
    )
    env[NESTED] = "1"
    env["TRITONKIT_CACHE_DIR"] = str(home / "tritonkit-cache")
    env["MPLBACKEND"] = "Agg"
    return env


def copy_of_the_tree(dest: Path) -> Path:
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = ROOT / name.decode()
        if src.is_file():
            target = dest / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


def run(command: str, cwd: Path, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=timeout,
    )


def test_readme_commands_in_a_fresh_environment(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout (its file list) to copy the tree")
    commands = section("The two commands")
    setup, tests = code_blocks(commands, "bash")
    (example,) = code_blocks(commands, "python")
    repo = copy_of_the_tree(tmp_path / "repo")
    env = fresh_shell_env(tmp_path)

    # (a): set up and run the main job, exactly as written.
    a = run(setup.strip(), repo, env, timeout=3600)
    installed = (repo / ".venv" / "bin" / "tritonkit").exists()
    if a.returncode != 0 and not installed and OFFLINE.search(a.stdout + a.stderr):
        pytest.skip(f"pip cannot reach a package index: {OFFLINE.search(a.stdout + a.stderr)[0]}")
    assert a.returncode == 0, f"(a) failed:\n{a.stdout[-3000:]}\n{a.stderr[-3000:]}"
    assert "checks passed" in a.stdout and "Timings need a CUDA GPU" in a.stdout
    assert "Traceback" not in a.stderr, a.stderr[-3000:]
    assert not re.search(r"\w+Warning:", a.stderr), a.stderr[-3000:]  # numpy's, torch's
    report = repo / "tritonkit-report"
    # What the README says appears without a GPU: the report, the results, one plot.
    for name in ("report.md", "results.json", "accuracy.png"):
        assert (report / name).is_file() and (report / name).stat().st_size > 0, name
        assert f"`{name}`" in commands, f"the README no longer names {name}"
    md = (report / "report.md").read_text()
    assert "![accuracy](accuracy.png)" in md and "interpreter timings measure nothing" in md.lower()
    assert not list(report.glob("roofline*")), "GPU-only plots in a CPU report"

    # The example on CPU tensors, in that environment, prints what its last comment says.
    python = str(repo / ".venv" / "bin" / "python")
    shown = example.strip().splitlines()[-1].rsplit("#", 1)[1].strip()
    ex = subprocess.run(
        [python, "-c", example], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert ex.returncode == 0, ex.stderr[-3000:]
    assert ex.stdout.strip() == shown

    # (b): each test command (full suite, fast tier), collected only (see the module
    # docstring). The flag goes before a line's trailing comment, or the shell would read it
    # as part of the comment and run the suite.
    lines = [line.split("#", 1)[0].strip() for line in tests.strip().splitlines()]
    lines = [line for line in lines if line]
    # A new shell needs the environment of (a): the block says so on its first line.
    assert lines[0] == ". .venv/bin/activate", tests
    lines = lines[1:]
    assert len(lines) >= 1, tests
    for line in lines:
        b = run(f". .venv/bin/activate && {line} --collect-only", repo, env, timeout=900)
        assert b.returncode == 0, f"(b) {line!r} failed:\n{b.stdout[-3000:]}\n{b.stderr[-3000:]}"
        assert re.search(r"\d+(/\d+)? tests collected", b.stdout), b.stdout[-2000:]
