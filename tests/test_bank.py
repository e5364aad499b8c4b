"""The question bank's schema and its errors, on a small fixture site.

Each bad input gets its own test that builds the fixture site with MkDocs (strict
and not) and checks that the build fails with a message naming the file, the
line and the field. The fixture holds one lesson and one question, so a build
takes about a second.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("pydantic")

from site_helpers import FIXTURE_LESSON, ROOT, copy_site, mkdocs_build  # noqa: E402

sys.path.insert(0, str(ROOT / "docs" / ".hooks"))
import bank as bank_lib  # noqa: E402

LESSON = FIXTURE_LESSON

QUESTION = textwrap.dedent("""\
    title: Why does the fixture question exist at all?
    part: 0
    lesson: part-0/alpha
    answer: Because the tests need one. It keeps them small.
    deep_dive: Block size {{ default("block_size") }}.
    follow_ups:
      - q: First follow-up?
        a: First answer.
      - q: Second follow-up?
        a: Second answer.
    weak_answer: Weak.
    validate: Build it.
    sources:
      - https://example.com/a
    verified:
      date: 2026-11-29
      vllm: VERSION
    kind: concept
    short_answer: It exists so the tests have one question to build.
    probes:
      - knows why a fixture needs exactly one question
    """)


@pytest.fixture(scope="module")
def vllm_version() -> str:
    return bank_lib._vllm_version(ROOT)


@pytest.fixture
def site(tmp_path: Path, vllm_version: str) -> Path:
    root = copy_site(tmp_path / "site")
    lesson = root / "docs/lessons/part-0/alpha.md"
    lesson.parent.mkdir(parents=True)
    lesson.write_text(LESSON.replace("VERSION", vllm_version))
    question = root / "questions/part-0/alpha-q.yaml"
    question.parent.mkdir(parents=True)
    question.write_text(QUESTION.replace("VERSION", vllm_version))
    return root


def _edit(site: Path, rel: str, old: str, new: str) -> None:
    path = site / rel
    text = path.read_text()
    assert old in text, f"fixture text {old!r} not in {rel}"
    path.write_text(text.replace(old, new))


def assert_build_fails(site: Path, tmp_path: Path, *expected: str) -> None:
    """Strict and non-strict builds both fail, and the message holds every expected piece."""
    for strict in (True, False):
        result = mkdocs_build(site, tmp_path / f"out-{strict}", strict=strict)
        output = result.stdout + result.stderr
        assert result.returncode != 0, f"build (strict={strict}) passed but should fail:\n{output}"
        for piece in expected:
            assert piece in output, f"expected {piece!r} in the build output (strict={strict}):\n{output[-3000:]}"


def test_fixture_site_builds(site: Path, tmp_path: Path):
    result = mkdocs_build(site, tmp_path / "out")
    assert result.returncode == 0, result.stderr[-3000:]
    page = (tmp_path / "out/questions/part-0/alpha-q/index.html").read_text()
    assert "Block size 16." in page  # the macro rendered inside the deep dive
    order = [page.index(f">{heading}<") for heading in
             ("Short answer", "Direct answer", "What the interviewer probes", "Deep dive")]
    assert order == sorted(order), "short answer, direct answer, probes, deep dive, in that order"
    assert "knows why a fixture needs exactly one question" in page
    assert "concept question" in page


def test_misconceptions_render_with_the_weak_answer(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "kind: concept", "kind: concept\nmisconceptions: [the fixture holds two questions]")
    result = mkdocs_build(site, tmp_path / "out")
    assert result.returncode == 0, result.stderr[-3000:]
    page = (tmp_path / "out/questions/part-0/alpha-q/index.html").read_text()
    belief = page.index("the fixture holds two questions")
    assert page.index('id="common-weak-answer"') < belief < page.index('id="how-to-validate"')


def test_missing_field(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "lesson: part-0/alpha\n", "")
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:1: field 'lesson': Field required")


def test_wrong_type(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "part: 0", "part: zero")
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:2: field 'part':")


def test_wrong_type_nested(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "  - q: Second follow-up?\n    a: Second answer.\n",
          "  - q: Second follow-up?\n    a: [not, text]\n")
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:10: field 'follow_ups[1].a':")


def test_unknown_field(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "weak_answer: Weak.", "weak_answer: Weak.\ndifficulty: hard")
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:12: field 'difficulty': unknown field")


def test_missing_short_answer(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "short_answer: It exists so the tests have one question to build.\n", "")
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:1: field 'short_answer': Field required")


def test_short_answer_over_30_words(site, tmp_path):
    long = " ".join(["word"] * 30) + " again."
    _edit(site, "questions/part-0/alpha-q.yaml", "It exists so the tests have one question to build.", long.capitalize())
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:19: field 'short_answer': has 31 words; at most 30")


def test_short_answer_of_two_sentences(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "one question to build.", "one question. It builds.")
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:19: field 'short_answer': has 2 sentences; write 1")


def test_four_probes(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "  - knows why a fixture needs exactly one question\n",
          "  - one\n  - two\n  - three\n  - four\n")
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:20: field 'probes': List should have at most 3 items")


def test_no_probes(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "probes:\n  - knows why a fixture needs exactly one question\n",
          "probes: []\n")
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:20: field 'probes': List should have at least 1 item")


def test_probe_of_two_lines(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "  - knows why a fixture needs exactly one question\n",
          "  - |\n    first line\n    second line\n")
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:21: field 'probes[0]': must be one line")


def test_bad_kind(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "kind: concept", "kind: trivia")
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:18: field 'kind': Input should be "
                                       "'concept', 'numbers', 'debug' or 'design'")


def test_answer_over_80_words(site, tmp_path):
    long = "Because the tests need one. Word " + " ".join(["word"] * 74) + " end."
    _edit(site, "questions/part-0/alpha-q.yaml", "Because the tests need one. It keeps them small.", long)
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:4: field 'answer': has 81 words; at most 80")


def test_answer_of_one_sentence(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "Because the tests need one. It keeps them small.", "Because.")
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:4: field 'answer': has 1 sentences; write 2-4")


def test_misconception_of_two_lines(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "kind: concept", "kind: concept\nmisconceptions: [\"a\\nb\"]")
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:19: field 'misconceptions[0]': must be one line")


def test_yaml_syntax_error(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "validate: Build it.", "validate: [Build it.")
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:", "YAML syntax error")


def test_lesson_names_no_lesson(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "lesson: part-0/alpha", "lesson: part-0/beta")
    assert_build_fails(site, tmp_path,
                       "questions/part-0/alpha-q.yaml:3: field 'lesson': names no lesson: "
                       "docs/lessons/part-0/beta.md does not exist")


def test_also_names_no_lesson(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "lesson: part-0/alpha", "lesson: part-0/alpha\nalso: [part-5/gamma]")
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:4: field 'also[0]': names no lesson")


def test_duplicate_slug(site, tmp_path):
    other = site / "questions/part-2/alpha-q.yaml"
    other.parent.mkdir()
    other.write_text((site / "questions/part-0/alpha-q.yaml").read_text().replace("part: 0", "part: 2"))
    assert_build_fails(site, tmp_path, "questions/part-2/alpha-q.yaml:", "duplicate slug 'alpha-q'",
                       "questions/part-0/alpha-q.yaml")


def test_part_disagrees_with_folder(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "part: 0", "part: 4")
    assert_build_fails(site, tmp_path,
                       "questions/part-0/alpha-q.yaml:2: field 'part': is 4 but the file is in questions/part-0/")


def test_stale_vllm_version(site, tmp_path, vllm_version):
    _edit(site, "questions/part-0/alpha-q.yaml", f"vllm: {vllm_version}", "vllm: 0.6.0")
    assert_build_fails(site, tmp_path, "questions/part-0/alpha-q.yaml:17: field 'verified.vllm': is 0.6.0")


def test_every_error_reported_at_once(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", "part: 0", "part: zero")
    bad = site / "questions/part-0/second.yaml"
    bad.write_text("title: [unclosed\n")
    assert_build_fails(site, tmp_path, "2 problem(s)", "alpha-q.yaml:2: field 'part'",
                       "second.yaml:2: YAML syntax error", "flow sequence that starts on line 1")


def test_undefined_macro_variable_fails(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", 'Block size {{ default("block_size") }}.', "Oops {{ no_such }}.")
    assert_build_fails(site, tmp_path, "no_such")


def test_macro_with_unknown_name_fails(site, tmp_path):
    _edit(site, "questions/part-0/alpha-q.yaml", 'default("block_size")', 'default("no_such_flag")')
    assert_build_fails(site, tmp_path, "no_such_flag")


def test_lesson_front_matter_checked(site, tmp_path):
    _edit(site, "docs/lessons/part-0/alpha.md", "order: 10\n", "order: ten\n")
    assert_build_fails(site, tmp_path, "docs/lessons/part-0/alpha.md:4: field 'order':")


def test_hand_written_interview_links_rejected(site, tmp_path):
    _edit(site, "docs/lessons/part-0/alpha.md", "Body.", "Body.\n\n## Interview links\n\n- by hand")
    assert_build_fails(site, tmp_path, "remove the hand-written 'Interview links' section")


def test_new_question_updates_its_lesson(site, tmp_path):
    """A new YAML file shows up on its lesson without touching the lesson."""
    new = site / "questions/part-0/another-one.yaml"
    new.write_text((site / "questions/part-0/alpha-q.yaml").read_text()
                   .replace("Why does the fixture question exist at all?", "What does a second question add?"))
    result = mkdocs_build(site, tmp_path / "out")
    assert result.returncode == 0, result.stderr[-3000:]
    lesson = (tmp_path / "out/lessons/part-0/alpha/index.html").read_text()
    assert 'href="../../../questions/part-0/another-one/"' in lesson


def test_bare_url_source_is_normalised():
    src = bank_lib.Source.model_validate("https://example.com/x")
    assert (src.title, src.url) == ("https://example.com/x", "https://example.com/x")


def test_snippet_needs_exactly_one_body():
    with pytest.raises(bank_lib.ValidationError, match="exactly one of"):
        bank_lib.Snippet.model_validate({"language": "python", "runnable": False})


def test_schema_file_in_sync():
    """questions/schema.json is what the model generates; regenerate with the command in the message."""
    committed = json.loads((ROOT / bank_lib.SCHEMA_FILE).read_text())
    assert committed == json.loads(bank_lib.schema_text()), (
        "questions/schema.json is out of date: run `python docs/.hooks/bank.py write-schema`")


def test_schema_rejects_unknown_keys_for_editors():
    schema = json.loads((ROOT / bank_lib.SCHEMA_FILE).read_text())
    assert schema["additionalProperties"] is False
    assert {"title", "part", "lesson", "kind", "short_answer", "answer", "probes", "deep_dive", "follow_ups", "weak_answer", "validate",
            "sources", "verified"} <= set(schema["required"])


def test_bank_cli_check_passes_on_the_repository():
    result = subprocess.run([sys.executable, str(ROOT / "docs/.hooks/bank.py"), "check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
