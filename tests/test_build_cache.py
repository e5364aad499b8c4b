"""The build's cache of lab output (docs/.hooks/bank_render.py): run once per input, rerun on any change to labs/."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("pydantic")  # the site's hooks; the GPU box has no site stack

from site_helpers import ROOT

sys.path.insert(0, str(ROOT / "docs" / ".hooks"))
import bank_render  # noqa: E402


def _project(tmp_path, body: str):
    labs = tmp_path / "project" / "labs"
    labs.mkdir(parents=True, exist_ok=True)
    (labs / "__init__.py").write_text("", encoding="utf-8")
    (labs / "hello.py").write_text(body, encoding="utf-8")
    return labs.parent


def test_lab_output_is_cached_on_the_command_and_the_labs_files(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_BANK_CACHE_DIR", str(tmp_path / "cache"))
    root = _project(tmp_path, "import sys\nprint('hello', sys.argv[1:])\n")
    stats = bank_render.LAB_CACHE_STATS
    before = dict(stats)
    assert bank_render.lab_output(root, "python -m labs.hello a", "run") == "hello ['a']"
    bank_render.clear_lab_outputs()  # a new build: only the disk cache remembers the run
    assert bank_render.lab_output(root, "python -m labs.hello a", "run") == "hello ['a']"
    assert (stats["run"] - before["run"], stats["cached"] - before["cached"]) == (1, 1)
    assert bank_render.lab_output(root, "python -m labs.hello b", "run") == "hello ['b']"  # other arguments
    (root / "labs" / "data.yaml").write_text("x: 1\n", encoding="utf-8")  # any file under labs/ counts
    bank_render.clear_lab_outputs()
    assert bank_render.lab_output(root, "python -m labs.hello a", "run") == "hello ['a']"
    assert stats["run"] - before["run"] == 3


def test_a_failing_lab_leaves_nothing_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_BANK_CACHE_DIR", str(tmp_path / "cache"))
    root = _project(tmp_path, "raise SystemExit('broken')\n")
    try:
        bank_render.lab_output(root, "python -m labs.hello", "run")
    except bank_render.LabOutputError as err:
        assert "exited 1" in str(err)
    else:
        raise AssertionError("a failing lab must fail the build")
    assert not list((tmp_path / "cache").rglob("*.txt"))
