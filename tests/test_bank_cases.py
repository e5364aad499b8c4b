"""The 49 malformed question files a tester tried, each refused with its file, line and field.

Every case is one bad file (or a bad edit of one) on the fixture site of
tests/test_bank.py. The build collects every problem of one kind before it stops,
so the cases are built in two groups, not one build each: problems found while
loading the bank (YAML, schema, files), and problems found while rendering it
(macros, includes, links, lab output), which the check only reaches once the
bank loads. Each group is built twice (strict and not) and checked once with
`python docs/.hooks/bank.py check`; each case then asserts that its own line is
in all three outputs and that all three failed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("pydantic")

from site_helpers import FIXTURE_LESSON, ROOT, copy_site, mkdocs_build  # noqa: E402

sys.path.insert(0, str(ROOT / "docs" / ".hooks"))
import bank as bank_lib  # noqa: E402

LESSON = FIXTURE_LESSON

BASE = textwrap.dedent("""\
    title: Why does the fixture question exist at all?
    part: 0
    lesson: part-0/alpha
    kind: concept
    short_answer: It exists so the tests have one question to build.
    answer: Because the tests need one. It keeps them small.
    probes:
      - knows why a fixture needs exactly one question
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
    """)


def edit(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, 1)


def line_of(text: str, needle: str, last: bool = False) -> int:
    return text[: text.rindex(needle) if last else text.index(needle)].count("\n") + 1


@dataclass(frozen=True)
class Case:
    name: str
    group: str  # "load" or "render"
    files: dict[str, str | bytes]  # path under the site -> content (VERSION is replaced)
    expect: str  # a piece of the one line that reports it
    extra: tuple[str, ...] = field(default=())  # more pieces that must be there


def _q(name: str, text: str | bytes, part: int = 0) -> dict[str, str | bytes]:
    return {f"questions/part-{part}/{name}.yaml": text}


def _case(name: str, group: str, text: str, needle: str | None, field_: str | None, message: str,
          slug: str | None = None, part: int = 0, last: bool = False) -> Case:
    slug = slug or name.replace("_", "-")
    path = f"questions/part-{part}/{slug}.yaml"
    where = f"{path}:{line_of(text, needle, last)}:" if needle else f"{path}:"
    head = f"{where} field '{field_}':" if field_ else where
    return Case(name, group, {path: text}, head, (message,))


LONG = "x" * 500
SCRIPT = "<script>alert(1)</script>"

CASES = [
    _case("dup_key", "load", edit("validate: Build it.\n", "validate: Build it.\nanswer: Again. And again.\n"),
          "answer: Again", "answer", "duplicate key (first given on line 6)"),
    _case("dup_key_same", "load", edit("kind: concept\n", "kind: concept\nkind: concept\n"),
          "kind: concept", "kind", "duplicate key (first given on line 4)", last=True),
    _case("tabs", "load", edit("  - q: First follow-up?\n", "  - q: First follow-up?\n\t"), "\t", None,
          "YAML syntax error: a tab character; indent with spaces"),
    _case("wrong_type_part", "load", edit("part: 0", "part: five"), "part: five", "part",
          "Input should be a valid integer"),
    _case("wrong_type_followups", "load", edit(
        "follow_ups:\n  - q: First follow-up?\n    a: First answer.\n  - q: Second follow-up?\n    a: Second answer.\n",
        "follow_ups: ask more\n"), "follow_ups:", "follow_ups", "Input should be a valid list"),
    _case("title_int", "load", edit("title: Why does the fixture question exist at all?", "title: 12345"),
          "title:", "title", "Input should be a valid string"),
    Case("empty_file", "load", _q("empty-one", ""), "questions/part-0/empty-one.yaml:1:",
         ("the file must be a YAML mapping of the question's fields",)),
    Case("list_file", "load", _q("list-one", "- a\n- b\n"), "questions/part-0/list-one.yaml:1:",
         ("the file must be a YAML mapping",)),
    Case("binary_file", "load", _q("binary-one", b"\xff\xfe\x00\x01title: x\n"),
         "questions/part-0/binary-one.yaml:1:", ("not UTF-8: byte 0xff",)),
    Case("latin1_file", "load", _q("latin1-one", BASE.replace("Weak.", "Caf\xe9.").encode("latin-1")),
         f"questions/part-0/latin1-one.yaml:{line_of(BASE, 'Weak.')}:", ("not UTF-8: byte 0xe9",)),
    _case("long_title", "load", edit("title: Why does the fixture question exist at all?", f"title: Why {LONG}?"),
          "title:", "title", "String should have at most 200 characters"),
    Case("long_answer", "load", _q("long-answer", edit("answer: Because", "answer: " + "word " * 420_000 + "Because")),
         "questions/part-0/long-answer.yaml:", ("KiB; a question file is at most 64 KiB",)),
    _case("missing_lesson", "load", edit("lesson: part-0/alpha\n", ""), "title:", None, "field 'lesson': Field required"),
    _case("lesson_nonexistent", "load", edit("lesson: part-0/alpha", "lesson: part-0/no-such-lesson"), "lesson:",
          "lesson", "names no lesson: docs/lessons/part-0/no-such-lesson.md does not exist"),
    _case("lesson_bad_id", "load", edit("lesson: part-0/alpha", "lesson: Part0/Alpha"), "lesson:", "lesson",
          "String should match pattern"),
    _case("anchor_link", "render", edit("weak_answer: Weak.", "weak_answer: See [the lesson](../../lessons/part-0/alpha.md#no-such-anchor)."),
          "weak_answer:", "weak_answer", "docs/lessons/part-0/alpha.md has no heading or id 'no-such-anchor'"),
    _case("page_link_missing", "render", edit("weak_answer: Weak.", "weak_answer: See [it](../../lessons/part-0/no-such-page.md)."),
          "weak_answer:", "weak_answer", "names docs/lessons/part-0/no-such-page.md, which does not exist"),
    Case("dup_slug", "load", {"questions/part-0/same-slug.yaml": BASE,
                              "questions/part-2/same-slug.yaml": BASE.replace("part: 0", "part: 2")},
         "questions/part-2/same-slug.yaml:", ("duplicate slug 'same-slug'", "questions/part-0/same-slug.yaml")),
    _case("wrong_folder", "load", BASE, "part: 0", "part", "is 0 but the file is in questions/part-2/",
          slug="wrong-folder", part=2),
    Case("outside_folder", "load", {"questions/stray.yaml": BASE}, "questions/stray.yaml:",
         ("questions live in questions/part-N/<slug>.yaml",)),
    Case("yml_extension", "load", {"questions/part-0/yml-one.yml": BASE}, "questions/part-0/yml-one.yml:",
         ("questions are .yaml files: rename it to yml-one.yaml",)),
    _case("unknown_field", "load", edit("weak_answer: Weak.", "weak_answer: Weak.\ndifficulty: hard"), "difficulty",
          "difficulty", "unknown field"),
    _case("typo_field", "load", edit("weak_answer: Weak.", "weak_answr: Weak."), "weak_answr", "weak_answr",
          "unknown field"),
    _case("macro_unknown_model", "render", edit("weak_answer: Weak.", 'weak_answer: "{{ model(\'no-such-model\').n_layers }} layers."'),
          "weak_answer:", "weak_answer", "macro error: SpecError: unknown model 'no-such-model'"),
    _case("macro_undefined", "render", edit(
        "deep_dive: Block size {{ default(\"block_size\") }}.",
        "deep_dive: >-\n  First line of the deep dive.\n  Then {{ no_such_macro() }} here."),
          "no_such_macro", "deep_dive", "macro error: UndefinedError: 'no_such_macro' is undefined"),
    _case("macro_syntax", "render", edit("deep_dive: Block size {{ default(\"block_size\") }}.",
                                         "deep_dive: Block size {{ default(\"block_size\")) }}."),
          "deep_dive:", "deep_dive", "template syntax error: unexpected ')'"),
    _case("jinja_in_prose", "render", edit("validate: Build it.",
                                           "validate: >-\n  Build it.\n\n  Loop {% for x in y %} over nothing."),
          "{% for", "validate", "template syntax error: Unexpected end of template"),
    _case("jinja_open_only", "render", edit("weak_answer: Weak.", "weak_answer: \"Weak {{ a b.\""),
          "weak_answer:", "weak_answer", "template syntax error: expected token 'end of print statement'"),
    _case("html_script", "load", edit("answer: Because the tests need one.", f"answer: Because {SCRIPT} the tests need one."),
          "answer: Because", "answer", "raw HTML (<script>) is not allowed"),
    _case("html_title", "load", edit("title: Why does the fixture question exist at all?",
                                     f"title: Why does {SCRIPT} exist at all?"),
          "title:", "title", "a title is plain text"),
    _case("followup_no_answer", "load", edit("  - q: First follow-up?\n    a: First answer.\n", "  - q: First follow-up?\n"),
          "  - q: First", "follow_ups[0].a", "Field required"),
    _case("followup_empty_answer", "load", edit("    a: First answer.", "    a: ''"), "    a: ''",
          "follow_ups[0].a", "String should have at least 1 character"),
    _case("followups_empty", "load", edit(
        "follow_ups:\n  - q: First follow-up?\n    a: First answer.\n  - q: Second follow-up?\n    a: Second answer.\n",
        "follow_ups: []\n"), "follow_ups:", "follow_ups", "List should have at least 2 items"),
    _case("source_not_url", "load", edit("  - https://example.com/a", "  - {title: A, url: example.com/a}"),
          "  - {title", "sources[0].url", "String should match pattern"),
    _case("source_bare_text", "load", edit("  - https://example.com/a", "  - the vLLM docs"), "  - the vLLM",
          "sources[0].url", "String should match pattern"),
    _case("source_js_url", "load", edit("  - https://example.com/a", "  - {title: A, url: 'javascript:alert(1)'}"),
          "  - {title", "sources[0].url", "String should match pattern"),
    _case("bad_date", "load", edit("  date: 2026-11-29", "  date: 2026-13-45"), "date: 2026-13-45", "verified.date",
          "'2026-13-45' is not a real date (month must be in 1..12)"),
    _case("vllm_float", "load", edit("  vllm: VERSION", "  vllm: 0.33"), "vllm: 0.33", "verified.vllm",
          "Input should be a valid string"),
    _case("yaml_syntax", "load", edit("weak_answer: Weak.", "weak_answer: Weak.\n  bad indent: here"), "  bad indent",
          None, "YAML syntax error"),
    _case("multi_doc", "load", BASE + "---\ntitle: second\n", "---\ntitle: second", None,
          "YAML syntax error: but found another document"),
    _case("python_tag", "load", edit("part: 0", "part: !!python/object/apply:os.system ['true']"), "part:", None,
          "could not determine a constructor for the tag 'tag:yaml.org,2002:python/object/apply:os.system'"),
    _case("null_answer", "load", edit("answer: Because the tests need one. It keeps them small.", "answer:"),
          "answer:\nprobes", "answer", "Input should be a valid string"),
    Case("uppercase_slug", "load", {"questions/part-0/Upper-Case.yaml": BASE}, "questions/part-0/Upper-Case.yaml:",
         ("the file name is the slug: lowercase words joined by '-'",)),
    _case("part_no_bank", "load", BASE.replace("part: 0", "part: 1"), "part: 1", "part",
          "Part 1 has no bank questions", part=1),
    _case("code_empty", "load", edit("follow_ups:", "code: {}\nfollow_ups:"), "code:", "code",
          "give a 'lab' or at least one snippet, or leave 'code' out"),
    _case("lab_missing_record", "render", edit("follow_ups:", "code:\n  lab:\n    command: python -m labs.kv_sizing\n"
                                               "    output: labs/results/does-not-exist.txt\nfollow_ups:"),
          "    output:", "code.lab.output",
          "lab output: recorded output labs/results/does-not-exist.txt does not exist"),
    _case("lab_run_fails", "render", edit("follow_ups:", "code:\n  lab:\n    command: python -m labs.kv_sizing --model no-such-model\n"
                                          "    output: run\nfollow_ups:"),
          "    command:", "code.lab.command",
          "lab output: `python -m labs.kv_sizing --model no-such-model` exited 2: "),
    _case("include_missing", "render", edit("follow_ups:", "code:\n  snippets:\n    - language: python\n      runnable: false\n"
                                            "      include: labs/no_such_file.py\nfollow_ups:"),
          "      include:", "code.snippets[0].include", "includes labs/no_such_file.py, which does not exist"),
    _case("include_bad_region", "render", edit("follow_ups:", "code:\n  snippets:\n    - language: python\n      runnable: false\n"
                                               "      include: labs/run_all.py:no-such-region\nfollow_ups:"),
          "      include:", "code.snippets[0].include",
          "labs/run_all.py has no '--8<-- [start:no-such-region]' marker"),
]
assert len(CASES) == 49 and len({c.name for c in CASES}) == 49


@dataclass
class Outputs:
    strict: subprocess.CompletedProcess
    lax: subprocess.CompletedProcess
    check: subprocess.CompletedProcess


def _build_group(group: str, tmp: Path) -> Outputs:
    version = bank_lib._vllm_version(ROOT)
    root = copy_site(tmp / "site")
    lesson = root / "docs/lessons/part-0/alpha.md"
    lesson.parent.mkdir(parents=True)
    lesson.write_text(LESSON.replace("VERSION", version))
    (root / "questions/part-0").mkdir(parents=True, exist_ok=True)
    (root / "questions/part-0/alpha-q.yaml").write_text(BASE.replace("VERSION", version))
    for case in CASES:
        if case.group != group:
            continue
        for rel, content in case.files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content.replace(b"VERSION", version.encode()))
            else:
                path.write_text(content.replace("VERSION", version), encoding="utf-8")
    check = subprocess.run([sys.executable, str(root / "docs/.hooks/bank.py"), "check"], cwd=root,
                           capture_output=True, text=True, timeout=600)
    return Outputs(mkdocs_build(root, tmp / "out-strict", strict=True),
                   mkdocs_build(root, tmp / "out-lax", strict=False), check)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Outputs]:
    return {g: _build_group(g, tmp_path_factory.mktemp(g)) for g in ("load", "render")}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_question_file_is_refused_at_its_line(case: Case, outputs):
    out = outputs[case.group]
    for label, proc in (("strict build", out.strict), ("non-strict build", out.lax), ("bank.py check", out.check)):
        text = proc.stdout + proc.stderr
        assert proc.returncode != 0, f"{label} passed with {case.name}"
        lines = [line for line in text.splitlines() if case.expect in line]
        assert lines, f"{label}: no line with {case.expect!r}:\n{text[-4000:]}"
        assert any(all(piece in line for piece in case.extra) for line in lines), (
            f"{label}: {case.expect!r} but not {case.extra}:\n" + "\n".join(lines))
        assert "Traceback" not in text, f"{label} printed a traceback"


def test_the_fixture_question_itself_is_fine(tmp_path):
    """The base file of every case passes: each failure above is the case's own."""
    version = bank_lib._vllm_version(ROOT)
    root = copy_site(tmp_path / "site")
    (root / "docs/lessons/part-0").mkdir(parents=True)
    (root / "docs/lessons/part-0/alpha.md").write_text(LESSON.replace("VERSION", version))
    (root / "questions/part-0").mkdir(parents=True, exist_ok=True)
    (root / "questions/part-0/alpha-q.yaml").write_text(
        edit("weak_answer: Weak.", "weak_answer: See [it](../../lessons/part-0/alpha.md#real-section).")
        .replace("VERSION", version))
    check = subprocess.run([sys.executable, str(root / "docs/.hooks/bank.py"), "check"], cwd=root,
                           capture_output=True, text=True, timeout=600)
    assert check.returncode == 0, check.stdout + check.stderr
