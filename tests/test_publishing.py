"""The GitHub Pages workflow: valid, running the README's test command, publishing the strict build.

The workflow is checked against the published GitHub Actions workflow schema
that check-jsonschema ships (`--builtin-schema vendor.github-workflows`), so
the test needs no network. Without check-jsonschema it skips, except under
CI=true.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from conftest import require_or_skip
from site_helpers import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "pages.yml"


def _readme_test_command() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.search(r"<!-- test-command -->\n```bash\n(.+?)\n```", text).group(1)


def _jobs() -> dict:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))["jobs"]


def _steps(job: str) -> list[dict]:
    return _jobs()[job]["steps"]


def _uses(step: dict) -> str:
    return step.get("uses", "").split("@")[0]


def test_workflow_matches_the_github_workflow_schema():
    require_or_skip(importlib.util.find_spec("check_jsonschema") is not None, "check-jsonschema",
                    "pip install check-jsonschema (in the `test` extra)")
    result = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                             str(WORKFLOW)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_workflow_runs_the_readme_test_command_exactly():
    runs = [step.get("run", "").strip() for step in _steps("build")]
    assert _readme_test_command() in runs, f"no step runs the README's test command; steps run: {runs}"


def test_workflow_publishes_the_strict_build_with_the_pages_actions():
    steps = _steps("build")
    build = next(step["run"] for step in steps if "mkdocs build" in step.get("run", ""))
    args = shlex.split(build)
    assert "--strict" in args
    site_dir = args[args.index("--site-dir") + 1]
    upload = next(step for step in steps if _uses(step) == "actions/upload-pages-artifact")
    assert upload["with"]["path"] == site_dir
    order = [_uses(step) or step.get("name", "") for step in steps]
    assert order.index("actions/upload-pages-artifact") > order.index("Build the site") > order.index(
        "Test (the README's test command)"), "test, then build, then upload"

    deploy = _jobs()["deploy"]
    assert deploy["needs"] == "build"
    assert deploy["permissions"] == {"pages": "write", "id-token": "write"}
    assert [_uses(step) for step in deploy["steps"]] == ["actions/deploy-pages"]
    assert "pull_request" in deploy["if"], "pull requests must not deploy"


def test_workflow_caches_the_pinned_assets_where_the_build_looks():
    pytest.importorskip("mkdocs")
    sys.path.insert(0, str(ROOT / "docs" / ".hooks"))
    import assets

    cache = next(step for step in _steps("build") if _uses(step) == "actions/cache")
    assert cache["with"]["path"] == "~/.cache/" + assets.CACHE_NAME
    assert "docs/.hooks/assets.py" in cache["with"]["key"]
