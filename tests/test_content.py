"""The measurable rules of a good question and lesson, checked on every file.

The judgement calls (is the worked example right, is a sentence filler) are for
review; what can be counted is counted here: the lesson skeleton's order, word
ranges, sentences in a direct answer, coverage of every lesson by a question,
and code that compiles and runs. One test per file, with its path as the id.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("pydantic")

from site_helpers import ROOT  # noqa: E402

sys.path.insert(0, str(ROOT / "docs" / ".hooks"))
import bank as bank_lib  # noqa: E402

BANK = bank_lib.load_bank(ROOT)
QUESTIONS = sorted(BANK.questions.values(), key=lambda q: q.path)
LESSONS = sorted(BANK.lessons.values(), key=lambda lesson: lesson.path)

LESSON_SKELETON = ["The problem", "The mechanism", "The numbers", "In vLLM", "Trade-offs and failure modes", "Try it"]
LESSON_WORDS = (700, 1500)
DEEP_DIVE_WORDS = (250, 700)
ANSWER_SENTENCES = bank_lib.ANSWER_SENTENCES


# The counting rules live with the schema, which enforces the spoken answers' limits at build time.
words = bank_lib.word_count
sentences = bank_lib.sentence_count


def _ids(items):
    return [item.path for item in items]


def test_the_bank_is_not_empty():
    assert QUESTIONS and LESSONS


@pytest.mark.parametrize("lesson", LESSONS, ids=_ids(LESSONS))
def test_lesson_follows_the_skeleton(lesson):
    text = (ROOT / lesson.path).read_text(encoding="utf-8")
    if not BANK.module(lesson.part).bank:
        pytest.skip("hands-on lessons (Part 1) follow their own steps")
    headings = re.findall(r"^## (.+?)\s*$", _strip_code(text), flags=re.M)
    found = [h for h in headings if h in LESSON_SKELETON]
    assert found == LESSON_SKELETON, f"{lesson.path}: skeleton sections {found}, expected {LESSON_SKELETON}"


@pytest.mark.parametrize("lesson", LESSONS, ids=_ids(LESSONS))
def test_lesson_length(lesson):
    n = words((ROOT / lesson.path).read_text(encoding="utf-8"))
    low, high = LESSON_WORDS
    assert low <= n <= high, f"{lesson.path}: {n} words of prose, expected {low}-{high}"


@pytest.mark.parametrize("lesson", LESSONS, ids=_ids(LESSONS))
def test_lesson_is_checked_and_sourced(lesson):
    assert lesson.meta.verified is not None, f"{lesson.path}: no verified {{date, vllm}} in front matter"
    assert lesson.meta.sources, f"{lesson.path}: no sources in front matter"


def _strip_code(text: str) -> str:
    return re.sub(r"^(```|~~~).*?^\1\s*$", "", text, flags=re.S | re.M)


@pytest.mark.parametrize("bq", QUESTIONS, ids=_ids(QUESTIONS))
def test_direct_answer_is_two_to_four_sentences(bq):
    n = sentences(bq.q.answer)
    low, high = ANSWER_SENTENCES
    assert low <= n <= high, f"{bq.path}: answer has {n} sentences, expected {low}-{high}"


@pytest.mark.parametrize("bq", QUESTIONS, ids=_ids(QUESTIONS))
def test_deep_dive_length(bq):
    n = words(bq.q.deep_dive)
    low, high = DEEP_DIVE_WORDS
    assert low <= n <= high, f"{bq.path}: deep dive has {n} words, expected {low}-{high}"


def test_every_lesson_of_the_bank_modules_is_tested_by_a_question():
    tested = {bq.q.lesson for bq in QUESTIONS}
    untested = [lesson.path for lesson in LESSONS if BANK.module(lesson.part).bank and lesson.id not in tested]
    assert not untested, f"lessons no question names in `lesson`: {untested}"


def test_verified_version_matches_the_facts_file():
    stale = [bq.path for bq in QUESTIONS if bq.q.verified.vllm != BANK.vllm_version]
    assert not stale, f"verified.vllm differs from {BANK.vllm_version}: {stale}"


# ---------------------------------------------------------------------------
# Code in questions: Python snippets compile; runnable ones run
# ---------------------------------------------------------------------------


def _region(include: str) -> str:
    """The code a `labs/file.py:region` include shows (the whole file without a region)."""
    path, _, region = include.partition(":")
    text = (ROOT / path).read_text(encoding="utf-8")
    if not region:
        return text
    match = re.search(rf"^[ \t]*# --8<-- \[start:{re.escape(region)}\]\n(.*?)^[ \t]*# --8<-- \[end:{region}\]",
                      text, flags=re.S | re.M)
    assert match, f"{include}: no region '{region}' in {path}"
    return textwrap.dedent(match.group(1))


SNIPPETS = [(bq, i, s) for bq in QUESTIONS if bq.q.code for i, s in enumerate(bq.q.code.snippets)]
SNIPPET_IDS = [f"{bq.path}#snippet{i}" for bq, i, _ in SNIPPETS]


@pytest.mark.parametrize(("bq", "index", "snippet"), SNIPPETS, ids=SNIPPET_IDS)
def test_python_snippet_compiles_and_runnable_runs(bq, index, snippet):
    code = _region(snippet.include) if snippet.include else snippet.code
    if snippet.language != "python":
        assert not snippet.runnable, f"{bq.path}: only Python snippets can be runnable"
        return
    try:
        compile(code, f"{bq.path}#snippet{index}", "exec")
    except SyntaxError as err:
        pytest.fail(f"{bq.path} snippet {index} does not compile: {err}")
    if not snippet.runnable:
        return
    if snippet.include and ":" in snippet.include:
        pytest.fail(f"{bq.path} snippet {index}: a region cannot run alone; mark it runnable: false")
    args = [sys.executable, "-c", code] if snippet.code else [sys.executable, snippet.include]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{bq.path} snippet {index} failed:\n{result.stderr[-2000:]}"
