"""The question bank and the lesson catalogue: schema, loading, validation.

Plain functions with no MkDocs import, so the hook, the macros, the tests and a
future build tool can all call them. The site build loads the bank once (the
result is memoised on the files' sizes and mtimes, so `mkdocs serve` reloads
only after an edit) and every error names the file, the line the YAML parser
gives, and the field, in the form editors and CI logs make clickable::

    questions/part-0/kv-cache-throughput-ceiling.yaml:3: field 'lesson': Field required

All errors of one build are collected and raised together, so a contributor who
broke three files sees three lines, not one per rebuild.
"""

from __future__ import annotations

import datetime as dt
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:  # `python docs/.hooks/bank.py check` runs without the project on the path
    sys.path.insert(0, str(_ROOT))

from labs import datafile  # noqa: E402

# ---------------------------------------------------------------------------
# Data: where things live
# ---------------------------------------------------------------------------

QUESTIONS_DIR = "questions"
LESSONS_DIR = "docs/lessons"
MODULES_FILE = "docs/.data/modules.yaml"
VLLM_FACTS_FILE = "labs/data/vllm.yaml"

SLUG_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
LESSON_ID_RE = re.compile(r"^part-(\d+)/([a-z0-9]+(?:-[a-z0-9]+)*)$")
# Lesson files that are not lessons: the module index and the skeleton.
NON_LESSON_FILES = {"index.md", "_template.md"}


# ---------------------------------------------------------------------------
# Schema: one model per record type. Unknown keys are errors everywhere.
# ---------------------------------------------------------------------------


# How long the spoken answers may be. Counted on the prose a reader hears: Jinja
# statements drop out and a rendered `{{ ... }}` counts as one word.
SHORT_ANSWER_WORDS = 30
ANSWER_WORDS = 80
ANSWER_SENTENCES = (2, 4)


def prose(markdown: str) -> str:
    """Markdown without front matter, code, tables, comments and HTML: what a reader reads as prose."""
    text = re.sub(r"\A---\n.*?\n---\n", "", markdown, flags=re.S)
    text = re.sub(r"^(```|~~~).*?^\1\s*$", "", text, flags=re.S | re.M)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    text = re.sub(r"\{%.*?%\}", "", text, flags=re.S)
    text = re.sub(r"\{\{.*?\}\}", "N", text, flags=re.S)  # a rendered number or link reads as one word
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("|"))
    return re.sub(r"<[^>]+>", "", text)


def word_count(markdown: str) -> int:
    return len(re.findall(r"[A-Za-z0-9][\w'’.,/%-]*", prose(markdown)))


def sentence_count(markdown: str) -> int:
    body = prose(markdown).strip()
    # A sentence ends at . ! or ? followed by a space and a capital, digit or opening bracket.
    return len(re.split(r"(?<=[.!?])\s+(?=[A-Z0-9(`\"])", body)) if body else 0


def _within(text: str, sentences: tuple[int, int], max_words: int) -> str:
    n, low, high = sentence_count(text), *sentences
    if not low <= n <= high:
        wanted = f"{low}" if low == high else f"{low}-{high}"
        raise ValueError(f"has {n} sentences; write {wanted}")
    n = word_count(text)
    if n > max_words:
        raise ValueError(f"has {n} words; at most {max_words}")
    return text


# ---------------------------------------------------------------------------
# Raw HTML and sizes
#
# A question's text is Markdown, rendered inside HTML the site builds around it
# (the practice-mode reveal blocks, the heading, the navigation, the search
# index). Raw HTML in it is rejected, not escaped: escaping would print tags the
# author meant as markup, and rendering them lets a file break that structure or
# run a script on every page. Markdown covers the rest: backticks for a literal
# `<rank>`, math for subscripts. Sizes are capped so one file cannot bloat every
# page that lists it; the caps sit well above the longest real field.
# ---------------------------------------------------------------------------

MAX_FILE_BYTES = 64 * 1024  # the longest question file is ~14 KB
TITLE_CHARS = 200
_CODE = re.compile(r"^(```|~~~).*?^\1[ \t]*$|(`+).+?\2", re.S | re.M)
_MATH = re.compile(r"\\\(.*?\\\)|\\\[.*?\\\]|\$\$.*?\$\$", re.S)
_HTML = re.compile(r"<(?:/?[A-Za-z][A-Za-z0-9-]*(?=[\s/>])|!--|![A-Za-z]|\?[A-Za-z])")
_TITLE_CHARS = re.compile(r"[<>{}\[\]`\\\n]")


def raw_html(markdown: str) -> str | None:
    """The first raw HTML tag or comment outside code and math, or None."""
    text = _MATH.sub(" ", _CODE.sub(" ", markdown))
    match = _HTML.search(text)
    if not match:
        return None
    end = text.find(">", match.start())
    return text[match.start(): end + 1 if 0 <= end - match.start() < 40 else match.start() + 20]


def _no_raw_html(value: str) -> str:
    tag = raw_html(value)
    if tag:
        raise ValueError(f"raw HTML ({tag}) is not allowed: write Markdown (a literal <...> goes in backticks, "
                         "a subscript in math such as \\(H_q\\))")
    return value


def _plain_title(value: str) -> str:
    bad = _TITLE_CHARS.search(value)
    if bad:
        shown = "a line break" if bad.group() == "\n" else repr(bad.group())
        raise ValueError(f"a title is plain text (it becomes the heading, the navigation entry and link text): "
                         f"remove {shown}")
    return value


def _link_text(value: str) -> str:
    _no_raw_html(value)
    if re.search(r"[\[\]\n]|\{[{%#]", value):
        raise ValueError("link text is one line without [ ] or Jinja ({{ {% {#}): it renders as [text](url)")
    return value


Markdown = Annotated[str, AfterValidator(_no_raw_html)]
PlainTitle = Annotated[str, AfterValidator(_plain_title)]
LinkText = Annotated[str, AfterValidator(_link_text)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class Source(_Strict):
    """A reference; in YAML either a bare URL or {title, url}."""

    title: LinkText = Field(min_length=1, max_length=300)
    url: str = Field(pattern=r"^https?://\S+$", max_length=2000)

    @model_validator(mode="before")
    @classmethod
    def _bare_url(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"title": value, "url": value}
        return value


class FollowUp(_Strict):
    q: Markdown = Field(min_length=1, max_length=500, description="The follow-up as the interviewer asks it.")
    a: Markdown = Field(min_length=1, max_length=5000, description="Its answer, in Markdown; macros render.")


class LabRun(_Strict):
    """A lab command and where the output shown beside it comes from.

    `output: run` makes the build run the command (torch-free labs only) and show
    what it prints; a path under labs/results/ shows a recorded GPU run, and a
    `file.json#a.b` path picks one string out of a recorded JSON file. In a
    recorded-results file (labs/recorded.py) a row is named by its key and the
    machine by its label: `oom.json#machines.NVIDIA H200.rows.fragmentation.transcript`.
    """

    command: str = Field(pattern=r"^python -m labs\.[a-z_.]+( .*)?$")
    output: str = Field(description="'run', or labs/results/<file>[.txt|.json#key]")
    caption: Markdown | None = Field(default=None, max_length=2000)

    @field_validator("output")
    @classmethod
    def _output_kind(cls, value: str) -> str:
        if value != "run" and not value.startswith("labs/results/"):
            raise ValueError("must be 'run' or a path under labs/results/")
        return value


class Snippet(_Strict):
    """A code snippet, inline or included from labs/ by region (`path:region`)."""

    language: str = Field(min_length=1)
    runnable: bool = Field(description="True: the tests run it; Python snippets compile regardless.")
    caption: Markdown | None = Field(default=None, max_length=2000)
    code: str | None = Field(default=None, max_length=20000)
    include: str | None = Field(default=None, pattern=r"^labs/[\w/.-]+\.py(:[\w-]+)?$")

    @model_validator(mode="after")
    def _one_body(self) -> "Snippet":
        if (self.code is None) == (self.include is None):
            raise ValueError("give exactly one of 'code' (inline) or 'include' (labs/<file>.py:<region>)")
        return self


class Code(_Strict):
    lab: LabRun | None = None
    snippets: list[Snippet] = Field(default_factory=list)

    @model_validator(mode="after")
    def _not_empty(self) -> "Code":
        if self.lab is None and not self.snippets:
            raise ValueError("give a 'lab' or at least one snippet, or leave 'code' out")
        return self


class Verified(_Strict):
    date: dt.date
    vllm: str = Field(pattern=r"^\d+\.\d+\.\d+$")


Kind = Literal["concept", "numbers", "debug", "design"]
OneLine = Annotated[str, Field(min_length=1, max_length=300, pattern=r"^[^\n]+$"), AfterValidator(_no_raw_html)]


class Question(_Strict):
    """One bank question; the page renders the fields in this order."""

    title: PlainTitle = Field(min_length=10, max_length=TITLE_CHARS,
                              description="The question as an interviewer asks it, in plain text.")
    topic: Markdown | None = Field(default=None, max_length=1000,
                                   description="The bank's entry as listed, for questions from it.")
    part: int = Field(ge=0, le=8)
    lesson: str = Field(pattern=LESSON_ID_RE.pattern, description="part-N/<slug> of the lesson it tests.")
    also: list[str] = Field(default_factory=list, description="Further lessons it touches.")
    kind: Kind = Field(description="concept: explain a mechanism; numbers: compute a figure; "
                                   "debug: find a fault from symptoms; design: choose under constraints.")
    short_answer: Markdown = Field(min_length=1, max_length=1000, description=f"The 10-second version: one sentence, "
                                                        f"at most {SHORT_ANSWER_WORDS} words.")
    answer: Markdown = Field(min_length=1, max_length=3000, description=f"The 30-second direct answer: {ANSWER_SENTENCES[0]}-"
                                                  f"{ANSWER_SENTENCES[1]} sentences, at most {ANSWER_WORDS} words.")
    probes: list[OneLine] = Field(min_length=1, max_length=3,
                                  description="1-3 lines: what the interviewer is testing.")
    deep_dive: Markdown = Field(min_length=1, max_length=20000)
    code: Code | None = None
    follow_ups: list[FollowUp] = Field(min_length=2, max_length=4)
    weak_answer: Markdown = Field(min_length=1, max_length=5000)
    misconceptions: list[OneLine] = Field(default_factory=list,
                                          description="Stale or wrong beliefs this question corrects, one line each.")
    validate_: Markdown = Field(alias="validate", min_length=1, max_length=5000)
    sources: list[Source] = Field(min_length=1)
    verified: Verified

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, populate_by_name=False)

    @field_validator("short_answer")
    @classmethod
    def _short_answer_size(cls, value: str) -> str:
        return _within(value, (1, 1), SHORT_ANSWER_WORDS)

    @field_validator("answer")
    @classmethod
    def _answer_size(cls, value: str) -> str:
        return _within(value, ANSWER_SENTENCES, ANSWER_WORDS)

    @field_validator("also")
    @classmethod
    def _also_ids(cls, value: list[str]) -> list[str]:
        for item in value:
            if not LESSON_ID_RE.match(item):
                raise ValueError(f"{item!r} is not a lesson id of the form part-N/<slug>")
        return value


class LessonMeta(_Strict):
    """A lesson's front matter. Sources and the checked date render at its end."""

    title: PlainTitle = Field(min_length=5, max_length=TITLE_CHARS)
    description: Markdown = Field(min_length=10, max_length=500, description="One line for the module index.")
    order: int = Field(ge=0, description="Position within the module.")
    render_macros: bool = True
    verified: Verified | None = None
    sources: list[Source] = Field(default_factory=list)
    hide: list[str] = Field(default_factory=list)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    path: str  # relative to the project root
    line: int | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        what = f" field '{self.field}':" if self.field else ""
        return f"{where}:{what} {self.message}"


class BankError(Exception):
    """Every problem found in one load, one per line."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        lines = "\n".join(f"  {p}" for p in problems)
        super().__init__(f"{len(problems)} problem(s) in the question bank:\n{lines}")


# ---------------------------------------------------------------------------
# Loaded records
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Module:
    part: int
    name: str
    scope: str
    bank: bool = True

    @property
    def label(self) -> str:
        return f"Part {self.part} · {self.name}"


@dataclass(frozen=True)
class Lesson:
    id: str  # part-N/<slug>
    part: int
    slug: str
    path: str  # docs/lessons/part-N/<slug>.md
    meta: LessonMeta

    @property
    def src_uri(self) -> str:
        return f"lessons/{self.id}.md"


@dataclass(frozen=True)
class BankQuestion:
    slug: str
    path: str  # questions/part-N/<slug>.yaml
    q: Question
    node: Any = field(default=None, compare=False, repr=False)  # the datafile.Document, for line numbers

    @property
    def id(self) -> str:
        return f"part-{self.q.part}/{self.slug}"

    @property
    def src_uri(self) -> str:
        return f"questions/{self.id}.md"

    @property
    def lessons(self) -> list[str]:
        """The lesson it tests, then the ones it touches."""
        return [self.q.lesson, *self.q.also]


@dataclass
class Bank:
    root: Path
    modules: list[Module]
    lessons: dict[str, Lesson]
    questions: dict[str, BankQuestion]  # by slug
    vllm_version: str
    # lesson id -> questions naming it, tested-by first
    links: dict[str, list[tuple[BankQuestion, str]]] = field(default_factory=dict)

    def module(self, part: int) -> Module:
        for m in self.modules:
            if m.part == part:
                return m
        raise KeyError(f"no module Part {part} in {MODULES_FILE}")

    def lessons_of(self, part: int) -> list[Lesson]:
        found = [lesson for lesson in self.lessons.values() if lesson.part == part]
        return sorted(found, key=lambda lesson: (lesson.meta.order, lesson.slug))

    def questions_of(self, part: int) -> list[BankQuestion]:
        found = [q for q in self.questions.values() if q.q.part == part]
        return sorted(found, key=lambda q: (self._lesson_order(q.q.lesson), q.q.title))

    def _lesson_order(self, lesson_id: str) -> tuple[int, str]:
        lesson = self.lessons[lesson_id]
        return (lesson.meta.order, lesson.slug)

    def related(self, question: BankQuestion) -> list[BankQuestion]:
        """Questions that share a lesson with this one, derived from the links."""
        seen: dict[str, BankQuestion] = {}
        for lesson_id in question.lessons:
            for other, _ in self.links.get(lesson_id, []):
                if other.slug != question.slug:
                    seen.setdefault(other.slug, other)
        return list(seen.values())


# ---------------------------------------------------------------------------
# YAML with line numbers
# ---------------------------------------------------------------------------


def _line_of(doc: datafile.Document | None, loc: tuple[Any, ...]) -> int | None:
    """The line of the value at `loc` (a pydantic error path), or of its nearest parent."""
    return doc.line(loc) if doc is not None else None


def _field_name(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _validation_problems(path: str, node: datafile.Document | None, err: ValidationError) -> list[Problem]:
    problems = []
    # An unknown key first: a typo'd field also shows up as the real one missing.
    for e in sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden"):
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        message = e["msg"]
        if e["type"] == "extra_forbidden":
            message = "unknown field (not in the schema; see questions/schema.json)"
        elif e["type"] == "value_error":
            message = message.removeprefix("Value error, ")
        elif e["type"] == "string_pattern_mismatch" and loc and loc[0] in ("probes", "misconceptions"):
            message = "must be one line"
        problems.append(Problem(path, _line_of(node, loc), _field_name(loc) or None, message))
    return problems


def _problem(exc: datafile.DataError, rel: str, line_offset: int = 0) -> Problem:
    return Problem(rel, exc.line + line_offset if exc.line else None, exc.field, exc.message)


def read_yaml_file(path: Path, rel: str) -> tuple[Any, datafile.Document | None, list[Problem]]:
    """Parse one question file strictly (labs/datafile.py): too large, not UTF-8, bad YAML, a
    duplicate key or an impossible date is a Problem at its line."""
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        return None, None, [Problem(rel, None, None, f"is {size / 1024:,.0f} KiB; a question file is at most "
                                                     f"{MAX_FILE_BYTES // 1024} KiB")]
    try:
        doc = datafile.load(path, rel)
    except datafile.DataError as exc:
        return None, None, [_problem(exc, rel)]
    return doc.data, doc, []


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def _load_modules(root: Path) -> list[Module]:
    """docs/.data/modules.yaml, validated by site_data.ModulesFile; a mistake is a BankError at its line."""
    from site_data import load_modules

    from labs.datafile import DataError

    try:
        data = load_modules(root)
    except DataError as exc:
        raise BankError([Problem(exc.file or MODULES_FILE, exc.line, exc.field, exc.message)]) from None
    return [Module(m.part, m.name, m.scope, m.bank) for m in data.modules]


def _vllm_version(root: Path) -> str:
    """The version the facts file pins, read through its own checked loader."""
    from labs import vllm_facts

    return vllm_facts.version(vllm_facts.load(root / VLLM_FACTS_FILE))


_FRONT_MATTER_RE = re.compile(r"\A---\s*\n(.*?\n)---\s*\n", re.S)


def _load_lessons(root: Path, modules: list[Module], problems: list[Problem]) -> dict[str, Lesson]:
    lessons: dict[str, Lesson] = {}
    parts = {m.part for m in modules}
    for path in sorted((root / LESSONS_DIR).glob("part-*/*.md")):
        if path.name in NON_LESSON_FILES:
            continue
        rel = path.relative_to(root).as_posix()
        match = LESSON_ID_RE.match(f"{path.parent.name}/{path.stem}")
        if not match:
            problems.append(Problem(rel, None, None, "lesson file names must be part-N/<lowercase-slug>.md"))
            continue
        part = int(match.group(1))
        if part not in parts:
            problems.append(Problem(rel, None, None, f"no module Part {part} in {MODULES_FILE}"))
            continue
        text = path.read_text(encoding="utf-8")
        fm = _FRONT_MATTER_RE.match(text)
        if not fm:
            problems.append(Problem(rel, 1, None, "missing front matter (--- title/description/order ---)"))
            continue
        try:
            node = datafile.loads(fm.group(1), rel)
            data = node.data
        except datafile.DataError as exc:
            problems.append(_problem(exc, rel, line_offset=1))  # front matter starts on line 2
            continue
        try:
            meta = LessonMeta.model_validate(data or {})
        except ValidationError as err:
            # Front matter starts on line 2 of the file.
            for p in _validation_problems(rel, node, err):
                problems.append(Problem(p.path, (p.line or 0) + 1, p.field, p.message))
            continue
        lesson_id = f"part-{part}/{path.stem}"
        lessons[lesson_id] = Lesson(lesson_id, part, path.stem, rel, meta)
    return lessons


def _load_questions(root: Path, modules: list[Module], problems: list[Problem]) -> dict[str, BankQuestion]:
    questions: dict[str, BankQuestion] = {}
    bank_parts = {m.part for m in modules if m.bank}
    for path in sorted((root / QUESTIONS_DIR).rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and path.suffix.lower() in (".yml", ".yaml") and path.suffix != ".yaml":
            problems.append(Problem(rel, None, None, f"questions are .yaml files: rename it to {path.stem}.yaml "
                                                     f"(a {path.suffix} file would be left out of the site)"))
            continue
        if path.suffix != ".yaml" or not path.is_file():
            continue
        folder = path.parent.relative_to(root / QUESTIONS_DIR).as_posix()
        folder_match = re.fullmatch(r"part-(\d+)", folder)
        if not folder_match:
            problems.append(Problem(rel, None, None, "questions live in questions/part-N/<slug>.yaml"))
            continue
        slug = path.stem
        if not SLUG_RE.match(slug):
            problems.append(Problem(rel, None, None, "the file name is the slug: lowercase words joined by '-'"))
            continue
        data, node, yaml_problems = read_yaml_file(path, rel)
        if yaml_problems:
            problems.extend(yaml_problems)
            continue
        if not isinstance(data, dict):
            problems.append(Problem(rel, 1, None, "the file must be a YAML mapping of the question's fields"))
            continue
        try:
            q = Question.model_validate(data)
        except ValidationError as err:
            problems.extend(_validation_problems(rel, node, err))
            continue
        folder_part = int(folder_match.group(1))
        if q.part != folder_part:
            problems.append(Problem(rel, _line_of(node, ("part",)), "part",
                                    f"is {q.part} but the file is in questions/part-{folder_part}/"))
            continue
        if q.part not in bank_parts:
            problems.append(Problem(rel, _line_of(node, ("part",)), "part",
                                    f"Part {q.part} has no bank questions (see {MODULES_FILE})"))
            continue
        if slug in questions:
            problems.append(Problem(rel, None, None,
                                    f"duplicate slug '{slug}': {questions[slug].path} has the same file name"))
            continue
        questions[slug] = BankQuestion(slug, rel, q, node)
    return questions


def _cross_check(bank: Bank, problems: list[Problem]) -> None:
    """Links between files: lessons named must exist; versions must match the facts file."""
    for bq in bank.questions.values():
        node = bq.node
        for i, lesson_id in enumerate(bq.lessons):
            loc: tuple[Any, ...] = ("lesson",) if i == 0 else ("also", i - 1)
            if lesson_id not in bank.lessons:
                problems.append(Problem(bq.path, _line_of(node, loc), _field_name(loc),
                                        f"names no lesson: docs/lessons/{lesson_id}.md does not exist"))
        if bq.q.verified.vllm != bank.vllm_version:
            problems.append(Problem(bq.path, _line_of(node, ("verified", "vllm")), "verified.vllm",
                                    f"is {bq.q.verified.vllm}, but the site describes vLLM {bank.vllm_version} "
                                    f"({VLLM_FACTS_FILE}); re-check the content, then update it"))
    for lesson in bank.lessons.values():
        v = lesson.meta.verified
        if v is not None and v.vllm != bank.vllm_version:
            problems.append(Problem(lesson.path, None, "verified.vllm",
                                    f"is {v.vllm}, but the site describes vLLM {bank.vllm_version}"))


def _link(bank: Bank) -> None:
    for bq in bank.questions.values():
        for i, lesson_id in enumerate(bq.lessons):
            bank.links.setdefault(lesson_id, []).append((bq, "tests" if i == 0 else "touches"))
    for entries in bank.links.values():
        entries.sort(key=lambda e: (e[1] != "tests", e[0].q.title))


def load_bank(root: Path) -> Bank:
    """Load and validate modules, lessons and questions; raise BankError listing every problem."""
    root = Path(root).resolve()
    problems: list[Problem] = []
    modules = _load_modules(root)
    lessons = _load_lessons(root, modules, problems)
    questions = _load_questions(root, modules, problems)
    bank = Bank(root, modules, lessons, questions, _vllm_version(root))
    _cross_check(bank, problems)
    if problems:
        raise BankError(problems)
    _link(bank)
    return bank


# ---------------------------------------------------------------------------
# Once per build
# ---------------------------------------------------------------------------

_CACHE: dict[Path, tuple[tuple, Bank]] = {}


def _signature(root: Path) -> tuple:
    files = [root / MODULES_FILE, root / VLLM_FACTS_FILE]
    files += sorted((root / QUESTIONS_DIR).glob("**/*.yaml"))
    files += sorted((root / LESSONS_DIR).glob("part-*/*.md"))
    return tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)


def get_bank(root: Path) -> Bank:
    """The bank for this build: loaded once, reloaded only when a file changed."""
    root = Path(root).resolve()
    sig = _signature(root)
    cached = _CACHE.get(root)
    if cached and cached[0] == sig:
        return cached[1]
    bank = load_bank(root)
    _CACHE[root] = (sig, bank)
    return bank


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a question file, committed as questions/schema.json for editors."""
    schema = Question.model_json_schema(by_alias=True)
    # A source may also be a bare URL (the loader normalises it): say so to editors.
    source = schema["$defs"]["Source"]
    schema["$defs"]["Source"] = {"anyOf": [{"type": "string", "pattern": r"^https?://\S+$"}, source]}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Interview bank question (questions/part-N/<slug>.yaml)"
    return schema


# ---------------------------------------------------------------------------
# Command line: keep questions/schema.json in step with the model
# ---------------------------------------------------------------------------

SCHEMA_FILE = "questions/schema.json"


def schema_text() -> str:
    import json

    return json.dumps(json_schema(), indent=2, sort_keys=False, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        description="Validate the question bank, or write/check questions/schema.json.")
    parser.add_argument("mode", choices=["check", "write-schema", "check-schema"],
                        help="check: load and validate every question and lesson; write-schema: regenerate "
                             f"{SCHEMA_FILE} from the model; check-schema: fail if it is out of date")
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[2]),
                        help="project root (default: this checkout)")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if args.mode == "check":
        import bank_check  # imports this module as `bank`: see the __main__ block

        from labs.datafile import DataError
        from site_data import load_glossary

        from labs import recorded

        try:
            recorded.check_all(root / "labs" / "results")
        except recorded.RecordedError as err:
            print(f"1 problem(s) in the recorded lab results:\n  {err}")
            return 1
        try:
            bank = load_bank(root)
            load_glossary(root)
            problems = bank_check.check(bank)
            if problems:
                raise BankError(problems)
        except BankError as err:
            print(err)
            return 1
        except DataError as err:
            print(f"1 problem(s) in the site's data:\n  {err}")
            return 1
        print(f"ok: {len(bank.questions)} questions, {len(bank.lessons)} lessons, "
              "and every check the build runs on them")
        return 0
    target = root / SCHEMA_FILE
    if args.mode == "write-schema":
        target.write_text(schema_text(), encoding="utf-8")
        print(f"wrote {SCHEMA_FILE}")
        return 0
    if not target.is_file() or target.read_text(encoding="utf-8") != schema_text():
        print(f"{SCHEMA_FILE} is out of date: run `python docs/.hooks/bank.py write-schema`")
        return 1
    print(f"{SCHEMA_FILE} is up to date")
    return 0


if __name__ == "__main__":
    # Run as the module `bank`, the one the hooks import, so there is one BankError class.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bank

    raise SystemExit(bank.main())
