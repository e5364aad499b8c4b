"""MkDocs hook: turn the question bank into pages, navigation and lesson footers.

MkDocs calls these events in order: `on_config` loads and validates the bank
(once per build; a bad file stops the build with file, line and field) and
expands the navigation; `on_files` adds one generated page per question plus
the index pages; `on_page_markdown` ends every lesson with its sources and
Interview links and appends the glossary's abbreviations to every page;
`on_page_context` points a question page's edit link at its YAML file.

Kept apart from macros.py: one module cannot be both the macros module and a
hook module (MkDocs and mkdocs-macros would both load it and the events clash).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bank as bank_lib  # noqa: E402
import bank_check  # noqa: E402
import bank_render as render  # noqa: E402
import glossary  # noqa: E402
from labs.datafile import DataError  # noqa: E402  (site_data, imported by glossary, put the root on the path)

# Nav entries in mkdocs.yml that the hook expands into generated sections.
LESSONS_INDEX = "lessons/index.md"
BANK_INDEX = "questions/index.md"
LABS_INDEX = "labs/index.md"

_state: dict = {}


# ---------------------------------------------------------------------------
# Helper functions
# ---------------------------------------------------------------------------


def _root(config) -> Path:
    return Path(config.config_file_path).resolve().parent


def _lessons_section(bank: bank_lib.Bank) -> list:
    section: list = [LESSONS_INDEX]
    for module in bank.modules:
        pages = [f"lessons/part-{module.part}/index.md"]
        pages += [lesson.src_uri for lesson in bank.lessons_of(module.part)]
        section.append({module.label: pages})
    return section


def _bank_section(bank: bank_lib.Bank) -> list:
    section: list = [BANK_INDEX]
    for module in bank.modules:
        if module.bank:
            pages = [f"questions/part-{module.part}/index.md"]
            pages += [bq.src_uri for bq in bank.questions_of(module.part)]
            section.append({module.label: pages})
    return section


def _folder_section(docs_dir: Path, folder: str) -> list:
    """The folder's index first, then its other pages in file-name order."""
    pages = sorted(p.name for p in (docs_dir / folder).glob("*.md") if p.name != "index.md")
    return [f"{folder}/index.md", *(f"{folder}/{name}" for name in pages)]


def _expand_nav(nav: list, expansions: dict[str, list]) -> list:
    out = []
    for entry in nav:
        if isinstance(entry, dict):
            (title, value), = entry.items()
            if isinstance(value, str) and value in expansions:
                out.append({title: expansions[value]})
            elif isinstance(value, list):
                out.append({title: _expand_nav(value, expansions)})
            else:
                out.append(entry)
        else:
            out.append(entry)
    return out


# ---------------------------------------------------------------------------
# Hooks
# ---------------------------------------------------------------------------


def _check_recorded_results(root: Path) -> None:
    """Read every labs/results/*.json once, so a broken file stops the build with its name and position."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from labs import recorded

    try:
        recorded.check_all(root / "labs" / "results")
    except recorded.RecordedError as err:
        raise PluginError(f"recorded lab results: {err}") from None


def on_config(config):
    root = _root(config)
    render.clear_lab_outputs()
    _check_recorded_results(root)
    try:
        bank = bank_lib.get_bank(root)
        _state["abbreviations"] = glossary.abbreviation_lines(root)
        # What the pages would fail on (macros, includes, links, lab output), found first and
        # reported at the YAML line. A PluginError stops the build, strict or not.
        problems = bank_check.check(bank)
        if problems:
            raise bank_lib.BankError(problems)
    except (bank_lib.BankError, DataError) as err:
        raise PluginError(str(err)) from None
    _state["bank"] = bank

    # One setting, extra.repository, gives the edit links. No repo_url: Material
    # would call the GitHub API for stars and forks on every page view.
    repository = config.extra.get("repository", "").rstrip("/")
    if repository and not config.edit_uri:
        config.edit_uri = f"{repository}/edit/main/docs/"

    # Included code is looked up from the project root, whatever the working directory.
    snippets = config.mdx_configs.setdefault("pymdownx.snippets", {})
    snippets["base_path"] = [str(root)]

    docs_dir = Path(config.docs_dir)
    config.nav = _expand_nav(config.nav or [], {
        LESSONS_INDEX: _lessons_section(bank),
        BANK_INDEX: _bank_section(bank),
        LABS_INDEX: _folder_section(docs_dir, "labs"),
    })
    return config


def on_files(files, config):
    bank: bank_lib.Bank = _state["bank"]
    try:
        pages = {
            BANK_INDEX: render.bank_index(bank),
            LESSONS_INDEX: render.lessons_index(bank),
            glossary.PAGE: glossary.glossary_page(_root(config)),
        }
        for module in bank.modules:
            pages[f"lessons/part-{module.part}/index.md"] = render.lessons_module_index(bank, module)
            if module.bank:
                pages[f"questions/part-{module.part}/index.md"] = render.bank_module_index(bank, module)
        for bq in bank.questions.values():
            pages[bq.src_uri] = render.question_page(bank, bq)
    except render.LabOutputError as err:
        raise PluginError(f"lab output for the question bank: {err}") from None
    for uri, content in pages.items():
        if files.get_file_from_path(uri) is not None:
            raise PluginError(f"docs/{uri} is generated by the build: delete the hand-written file")
        files.append(File.generated(config, uri, content=content))
    return files


def on_page_markdown(markdown, page, config, files):
    bank: bank_lib.Bank = _state["bank"]
    uri = page.file.src_uri
    lesson_id = uri[len("lessons/"):-len(".md")] if uri.startswith("lessons/") else None
    if lesson_id in bank.lessons:
        if "## Interview links" in markdown:
            raise PluginError(f"docs/{uri}: remove the hand-written 'Interview links' section; "
                              "the build renders it from the questions")
        markdown += render.lesson_footer(bank, bank.lessons[lesson_id])
    return markdown + "\n\n" + _state["abbreviations"]


def on_page_context(context, page, config, nav):
    slug = page.meta.get("bank_question")
    repository = config.extra.get("repository", "").rstrip("/")
    if slug and repository:
        bq = _state["bank"].questions[slug]
        page.edit_url = f"{repository}/edit/main/{bq.path}"
    return context
