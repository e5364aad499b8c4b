"""`python -m labs.run_all`: the one command that runs every GPU test and benchmark.

What can be checked without a GPU is checked here: the help, the step list, the
errors for bad input, the exit code 2 with a clear message when no CUDA GPU is
visible, and that the module imports only the standard library (it must start
on a machine where torch is broken, to say so).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from conftest import HAS_CUDA, ROOT

RUN_ALL = ROOT / "labs" / "run_all.py"


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "labs.run_all", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _module_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:  # module level only: torch may be imported inside a child process
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names |= {f"{node.module}.{alias.name}" if node.module == "labs" else node.module for alias in node.names}
    return names


def test_module_level_imports_are_standard_library_only():
    # labs.cli (the shared argument checks) is allowed, as long as it is standard library only itself.
    names = _module_level_imports(RUN_ALL) - {"labs.cli"}
    names |= _module_level_imports(ROOT / "labs" / "cli.py")
    non_stdlib = sorted(n for n in names if n.split(".")[0] not in sys.stdlib_module_names)
    assert not non_stdlib, f"labs/run_all.py imports {non_stdlib} at module level"


def test_help_documents_every_flag_and_step():
    result = _run("--help")
    assert result.returncode == 0, result.stderr
    for flag in ("--out", "--only", "--timeout", "--overwrite", "--list"):
        assert flag in result.stdout
    for step in ("gpu-tests", "paged-attention-bench", "kv-sizing-check", "oom-scenarios"):
        assert step in result.stdout


def test_list_runs_nothing_and_shows_the_gpu_test_command():
    result = _run("--list")
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.split()[:2] == ["gpu-tests", "present"]
    assert "-m pytest -m gpu" in first


def test_out_is_required():
    result = _run()
    assert result.returncode == 2
    assert "--out DIR is required" in result.stderr


def test_unknown_step_is_rejected_with_the_known_names():
    result = _run("--out", "unused", "--only", "no-such-step")
    assert result.returncode == 2
    assert "gpu-tests" in result.stderr


def test_out_that_is_a_file_is_rejected(tmp_path):
    target = tmp_path / "a-file"
    target.write_text("x")
    result = _run("--out", str(target))
    assert result.returncode == 2
    assert "not a folder" in result.stderr


def test_non_empty_out_needs_overwrite(tmp_path):
    (tmp_path / "old.log").write_text("x")
    result = _run("--out", str(tmp_path))
    assert result.returncode == 2
    assert "--overwrite" in result.stderr


@pytest.mark.skipif(HAS_CUDA, reason="checks the message on a machine without a CUDA GPU")
def test_without_cuda_it_exits_2_and_says_why(tmp_path):
    out = tmp_path / "run"
    result = _run("--out", str(out))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no CUDA GPU visible" in result.stderr or "torch is not installed" in result.stderr
    assert not out.exists(), "nothing is written when the run cannot happen"
