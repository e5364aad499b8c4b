"""What the build does with a question's text, done before any page is written: every failure at its YAML line.

The schema (bank.py) checks each field's shape. The text then goes through
mkdocs-macros, pymdownx.snippets and MkDocs' link checks on the generated page,
whose errors name `questions/part-N/<slug>.md`, a file nobody edits, and whose
broken links a non-strict build ships. So the hook runs the same steps here,
first, on each field of each question:

* macros: the field is rendered by a Jinja environment set up as mkdocs-macros
  sets it up (same macros from macros.py, undefined names an error);
* includes: a `--8<--` line or a snippet's `include` must name an existing file
  under the project root, and its region must have start and end markers;
* links: a relative link must reach a page of the site, and its `#anchor` a
  heading or id there; protocol-relative (`//host/x`), site-absolute (`/x`) and
  non-web schemes are refused;
* lab output: the command runs (or the recorded file and key exist).

Each problem names the YAML file, the field and the line inside the YAML. The
hook and `python docs/.hooks/bank.py check` both call `check(bank)`, so the
validator fails exactly when the build would.
"""

from __future__ import annotations

import importlib.util
import posixpath
import re
import sys
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import bank_render as render
from bank import Bank, BankQuestion, Problem
from bank import _field_name as _field

# ---------------------------------------------------------------------------
# The Markdown fields of a question
# ---------------------------------------------------------------------------


def markdown_fields(bq: BankQuestion) -> Iterator[tuple[tuple[Any, ...], str]]:
    """(YAML path, text) of every field the page renders as Markdown, in page order."""
    q = bq.q
    yield ("title",), q.title
    if q.topic:
        yield ("topic",), q.topic
    yield ("short_answer",), q.short_answer
    yield ("answer",), q.answer
    for i, text in enumerate(q.probes):
        yield ("probes", i), text
    yield ("deep_dive",), q.deep_dive
    if q.code and q.code.lab and q.code.lab.caption:
        yield ("code", "lab", "caption"), q.code.lab.caption
    for i, snippet in enumerate(q.code.snippets if q.code else []):
        if snippet.caption:
            yield ("code", "snippets", i, "caption"), snippet.caption
    for i, f in enumerate(q.follow_ups):
        yield ("follow_ups", i, "q"), f.q
        yield ("follow_ups", i, "a"), f.a
    yield ("weak_answer",), q.weak_answer
    for i, text in enumerate(q.misconceptions):
        yield ("misconceptions", i), text
    yield ("validate",), q.validate_
    for i, s in enumerate(q.sources):
        yield ("sources", i, "title"), s.title


def _span(bq: BankQuestion, loc: tuple[Any, ...]) -> tuple[int, int]:
    """First and last YAML line of the field at `loc` (its key line to the line before the next key)."""
    doc = bq.node
    start = doc.line(loc)
    later = [n for p, n in doc.lines.items() if n > start and tuple(p[:len(loc)]) != tuple(loc)]
    end = min(later) - 1 if later else len(doc.text.splitlines())
    return start, max(start, end)


def _line_for(bq: BankQuestion, loc: tuple[Any, ...], text: str, text_line: int | None,
              needle: str | None) -> int:
    """The YAML line of a problem found in a field's text: the line holding `needle`, else the
    source line of `text_line` (the field's n-th line), else the field's first line."""
    start, end = _span(bq, loc)
    source = bq.node.text.splitlines()
    window = list(range(start, min(end, len(source)) + 1))
    if needle:
        for n in window:
            if needle in source[n - 1]:
                return n
    if text_line:
        lines = text.splitlines()
        if 0 < text_line <= len(lines):
            probe = lines[text_line - 1].strip()[:40]
            for n in window:
                if probe and probe in source[n - 1]:
                    # The offending markup, when it is on a later line of a folded paragraph.
                    for m in window[window.index(n):]:
                        if "{{" in source[m - 1] or "{%" in source[m - 1] or "{#" in source[m - 1]:
                            return m
                    return n
    return start


# ---------------------------------------------------------------------------
# Macros, in an environment set up as mkdocs-macros sets it up
# ---------------------------------------------------------------------------


class _MacroEnv:
    """The part of mkdocs-macros' `env` that macros.define_env uses."""

    def __init__(self):
        self.macros: dict[str, Any] = {}
        self.filters: dict[str, Any] = {}
        self.variables: dict[str, Any] = {}
        self.page: Any = None

    def macro(self, fn, name: str | None = None):
        self.macros[name or fn.__name__] = fn
        return fn

    def filter(self, fn, name: str | None = None):
        self.filters[name or fn.__name__] = fn
        return fn


class Renderer:
    """Renders Markdown as one page of the site renders it, with `page` set to that page."""

    def __init__(self, root: Path):
        import jinja2

        spec = importlib.util.spec_from_file_location("bank_check_macros", root / "macros.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.env = _MacroEnv()
        module.define_env(self.env)
        # mkdocs.yml: on_undefined: strict; the loader root is docs/ (include_dir's default).
        self.jinja = jinja2.Environment(loader=jinja2.FileSystemLoader(str(root / "docs")),
                                        undefined=jinja2.StrictUndefined)
        self.jinja.globals.update(self.env.macros)
        self.jinja.filters.update(self.env.filters)

    def render(self, text: str, src_uri: str, title: str = "") -> str:
        page = SimpleNamespace(file=SimpleNamespace(src_uri=src_uri), meta={}, title=title,
                               url=src_uri[:-3] + "/" if src_uri.endswith(".md") else src_uri)
        self.env.page = page
        return self.jinja.from_string(text).render(page=page)


def _template_line(exc: BaseException) -> int | None:
    """The template line a Jinja error happened on (Jinja rewrites its frames as '<template>')."""
    lineno = getattr(exc, "lineno", None)
    for frame, line in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == "<template>":
            lineno = line
    return lineno


def _macro_problems(renderer: Renderer, bq: BankQuestion) -> list[Problem]:
    import jinja2

    problems = []
    for loc, text in markdown_fields(bq):
        try:
            renderer.render(text, bq.src_uri, bq.q.title)
        except jinja2.TemplateSyntaxError as exc:
            line = _line_for(bq, loc, text, exc.lineno, None)
            problems.append(Problem(bq.path, line, _field(loc), f"template syntax error: {exc.message}"))
        except Exception as exc:  # noqa: BLE001  (a macro may raise anything; the page would fail on it)
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            name = re.search(r"'([^']+)' is undefined", message) or re.search(r"(\w+)\('", message)
            line = _line_for(bq, loc, text, _template_line(exc), name.group(1) if name else None)
            problems.append(Problem(bq.path, line, _field(loc), f"macro error: {type(exc).__name__}: {message}"))
    return problems


# ---------------------------------------------------------------------------
# Includes (pymdownx.snippets, base path: the project root)
# ---------------------------------------------------------------------------

_SNIPPET_LINE = re.compile(r'^[ \t]*-{1,}8<-{1,}[ \t]+(["\'])(.+?)\1[ \t]*$', re.M)


def include_problem(root: Path, spec: str) -> str | None:
    """Why `path[:region]` cannot be included, or None."""
    path_part, _, region = spec.partition(":")
    path = (root / path_part)
    if not path.resolve().is_relative_to(root.resolve()):
        return f"includes {path_part}, outside the project"
    if not path.is_file():
        return f"includes {path_part}, which does not exist"
    if region and not region.isdigit():
        text = path.read_text(encoding="utf-8", errors="replace")
        for marker in ("start", "end"):
            if not re.search(rf"-{{1,}}8<-{{1,}}\s*\[{marker}:{re.escape(region)}\]", text):
                return f"includes {path_part}:{region}, but {path_part} has no '--8<-- [{marker}:{region}]' marker"
    return None


def _include_problems(root: Path, bq: BankQuestion) -> list[Problem]:
    problems = []
    for i, snippet in enumerate(bq.q.code.snippets if bq.q.code else []):
        if snippet.include:
            why = include_problem(root, snippet.include)
            if why:
                loc = ("code", "snippets", i, "include")
                problems.append(Problem(bq.path, bq.node.line(loc), _field(loc), why))
    for loc, text in markdown_fields(bq):
        for match in _SNIPPET_LINE.finditer(text):
            why = include_problem(root, match.group(2))
            if why:
                problems.append(Problem(bq.path, _line_for(bq, loc, text, None, match.group(2)), _field(loc), why))
    return problems


# ---------------------------------------------------------------------------
# Links
# ---------------------------------------------------------------------------

_CODE = re.compile(r"^(```|~~~).*?^\1[ \t]*$|(`+).+?\2", re.S | re.M)
_JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.S)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'(].*?[\"')])?\s*\)")
_REF_DEF = re.compile(r"^[ ]{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
_AUTOLINK = re.compile(r"<([a-zA-Z][a-zA-Z0-9+.-]*:[^\s>]*)>")
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*):")
WEB_SCHEMES = {"http", "https", "mailto"}


def link_targets(markdown: str) -> list[str]:
    """Every link target the author typed (not those a macro produces), code and Jinja left out."""
    text = _JINJA.sub(" ", _CODE.sub(" ", markdown))
    return ([m.group(1) for m in _LINK.finditer(text)] + [m.group(1) for m in _REF_DEF.finditer(text)]
            + [m.group(1) for m in _AUTOLINK.finditer(text)])


class SitePages:
    """The pages of the site a link can reach, and the anchors in each."""

    def __init__(self, bank: Bank, renderer: Renderer | None):
        self.bank, self.renderer = bank, renderer
        self.docs = bank.root / "docs"
        self.generated = _generated_pages(bank)
        self._anchors: dict[str, set[str]] = {}

    def exists(self, uri: str) -> bool:
        return uri in self.generated or (self.docs / uri).is_file()

    def anchors(self, uri: str) -> set[str]:
        if uri not in self._anchors:
            self._anchors[uri] = _anchors_of(self._markdown(uri))
        return self._anchors[uri]

    def _markdown(self, uri: str) -> str:
        if uri in self.generated:
            text = self.generated[uri]()
        else:
            text = (self.docs / uri).read_text(encoding="utf-8", errors="replace")
        if self.renderer is not None and ("{{" in text or "{%" in text) and _renders_macros(self.bank, uri, text):
            try:
                return self.renderer.render(_body(text), uri)
            except Exception:  # noqa: BLE001  (that page's own errors are its build's business)
                pass
        return text


def _generated_pages(bank: Bank) -> dict[str, Any]:
    """The pages the hook adds, by source path, each a function that gives its Markdown."""
    pages: dict[str, Any] = {
        "questions/index.md": lambda: render.bank_index(bank),
        "lessons/index.md": lambda: render.lessons_index(bank),
        "reference/glossary.md": lambda: "# Glossary and notation\n\n## Notation\n\n## Terms\n",
    }
    for module in bank.modules:
        pages[f"lessons/part-{module.part}/index.md"] = lambda m=module: render.lessons_module_index(bank, m)
        if module.bank:
            pages[f"questions/part-{module.part}/index.md"] = lambda m=module: render.bank_module_index(bank, m)
    for bq in bank.questions.values():
        pages[bq.src_uri] = lambda b=bq: render.question_page(bank, b)
    return pages


def _renders_macros(bank: Bank, uri: str, text: str) -> bool:
    lesson_id = uri[len("lessons/"):-len(".md")] if uri.startswith("lessons/") else None
    if lesson_id in bank.lessons:
        return bank.lessons[lesson_id].meta.render_macros
    return bool(re.search(r"^render_macros:\s*true\s*$", text.split("\n---", 1)[0], re.M))


def _body(text: str) -> str:
    return re.sub(r"\A---\s*\n.*?\n---\s*\n", "", text, count=1, flags=re.S)


_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
_ATTR_ID = re.compile(r"\{:?[^}\n]*?#([\w-]+)[^}\n]*\}")
_HTML_ID = re.compile(r"""\b(?:id|name)\s*=\s*["']([^"']+)["']""")


def _anchors_of(markdown: str) -> set[str]:
    """Heading ids as the toc extension makes them, plus explicit `{#id}` and HTML ids."""
    from markdown.extensions.toc import slugify, unique

    text = re.sub(r"^(```|~~~).*?^\1[ \t]*$", "", _body(markdown), flags=re.S | re.M)
    found: set[str] = set()
    used: set[str] = set()
    for match in _HEADING.finditer(text):
        heading = match.group(2)
        explicit = _ATTR_ID.search(heading)
        if explicit:
            found.add(explicit.group(1))
            used.add(explicit.group(1))
            continue
        plain = re.sub(r"\{:?[^}]*\}\s*$", "", heading)  # an attribute list that sets no id
        plain = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", plain)  # links keep their text
        plain = re.sub(r"<[^>]+>|[`*_]", "", plain)
        found.add(unique(slugify(plain, "-"), used))
    found |= {m.group(1) for m in _ATTR_ID.finditer(text)}
    found |= {m.group(1) for m in _HTML_ID.finditer(text)}
    return found


def link_problem(pages: SitePages, from_uri: str, target: str) -> str | None:
    """Why a link typed on the page `from_uri` is broken, or None."""
    if target.startswith("//"):
        return (f"link {target} is protocol-relative: it points at the host {target[2:].split('/')[0]!r}; "
                "write a relative link to the .md file, or a full https:// address")
    scheme = _SCHEME.match(target)
    if scheme:
        if scheme.group(1).lower() not in WEB_SCHEMES:
            return f"link {target}: the {scheme.group(1)}: scheme is not allowed (use http, https or mailto)"
        return None
    if target.startswith("/"):
        return (f"link {target} is site-absolute: it breaks when the site is served under a path; "
                "write a relative link to the .md file")
    path, _, anchor = target.partition("#")
    if not path:
        uri = from_uri
    else:
        uri = posixpath.normpath(posixpath.join(posixpath.dirname(from_uri), path))
        if uri.startswith("../") or uri == "..":
            return f"link {target} leaves the site's docs/ folder"
        if path.endswith("/") or not posixpath.splitext(uri)[1]:
            return f"link {target} names a folder: link the page's .md file"
        if not pages.exists(uri):
            return f"link {target} names docs/{uri}, which does not exist"
    if anchor and uri.endswith(".md") and anchor not in pages.anchors(uri):
        return f"link {target}: docs/{uri} has no heading or id '{anchor}'"
    return None


def _link_problems(pages: SitePages, bq: BankQuestion) -> list[Problem]:
    problems = []
    for loc, text in markdown_fields(bq):
        for target in link_targets(text):
            why = link_problem(pages, bq.src_uri, target)
            if why:
                problems.append(Problem(bq.path, _line_for(bq, loc, text, None, target), _field(loc), why))
    return problems


# ---------------------------------------------------------------------------
# Lab output
# ---------------------------------------------------------------------------


def _lab_problems(bank: Bank, bq: BankQuestion) -> list[Problem]:
    lab = bq.q.code.lab if bq.q.code else None
    if lab is None:
        return []
    try:
        render.lab_output(bank.root, lab.command, lab.output)
    except render.LabOutputError as err:
        loc = ("code", "lab", "command" if lab.output == "run" else "output")
        return [Problem(bq.path, bq.node.line(loc), _field(loc), f"lab output: {err}")]
    return []


# ---------------------------------------------------------------------------
# All of it
# ---------------------------------------------------------------------------


def check(bank: Bank) -> list[Problem]:
    """Every problem the build would meet in the bank's questions, each at its YAML file, line and field."""
    root = bank.root
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    renderer = Renderer(root)
    pages = SitePages(bank, renderer)
    problems: list[Problem] = []
    for bq in sorted(bank.questions.values(), key=lambda b: b.path):
        found = _macro_problems(renderer, bq)
        found += _include_problems(root, bq)
        found += _link_problems(pages, bq)
        found += _lab_problems(bank, bq)
        problems += sorted(found, key=lambda p: p.line or 0)
    return problems
