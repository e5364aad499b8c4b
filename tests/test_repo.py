"""Promises the repository makes about itself: the README's commands and the fixed top level."""

from __future__ import annotations

import re
import subprocess

from site_helpers import ROOT

FIXED_TOP_LEVEL = {"mkdocs.yml", "docs", "questions", "labs", "macros.py", "tests", "pyproject.toml",
                   "README.md", "LICENSE"}


def _readme_commands() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return dict(re.findall(r"<!-- (\w+-command) -->\n```bash\n(.+?)\n```", text))


def test_readme_has_exactly_two_setup_commands_each_with_its_own_virtualenv():
    commands = _readme_commands()
    assert set(commands) == {"serve-command", "test-command"}
    serve, test = commands["serve-command"], commands["test-command"]
    assert serve.startswith("python3 -m venv ") and test.startswith("python3 -m venv ")
    assert "pip install -e ." in serve and "127.0.0.1:8000" in serve
    assert "pip install -e '.[test,labs,vllm,serve]'" in test and test.endswith("-m pytest")


def test_ci_runs_the_readme_test_command():
    """.ci/run extracts the command from the README; check that extraction finds the same line."""
    script = (ROOT / ".ci/run").read_text(encoding="utf-8")
    awk = re.search(r"test_command=\$\(awk '(.+?)' README.md\)", script).group(1)
    found = subprocess.run(["awk", awk, "README.md"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert found == _readme_commands()["test-command"]


def test_top_level_is_fixed():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    top = {path.split("/")[0] for path in tracked} if tracked else set()
    extra = {name for name in top if name not in FIXED_TOP_LEVEL and not name.startswith(".")}
    assert not extra, f"top-level entries outside the fixed layout: {sorted(extra)}"
