"""MkDocs hook: turn the question bank into pages, navigation and lesson footers.

MkDocs calls these events in order: `on_config` loads and validates the bank
(once per build; a bad file stops the build with file, line and field) and
expands the navigation; `on_files` adds one generated page per question plus
the index pages; `on_page_markdown` ends every lesson with its Interview links
and sources and appends the glossary's abbreviations to every page;
`on_page_context` points a question page's edit link at its YAML file;
`on_post_build` copies the build's plots (docs/.hooks/plotting.py) into the site.

Kept apart from macros.py: one module cannot be both the macros module and a
hook module (MkDocs and mkdocs-macros would both load it and the events clash).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bank as bank_lib  # noqa: E402
import bank_check  # noqa: E402
import bank_render as render  # noqa: E402
import glossary  # noqa: E402
import study  # noqa: E402
import plotting  # noqa: E402
import sections  # noqa: E402
from labs.datafile import DataError  # noqa: E402  (site_data, imported by glossary, put the root on the path)

# Nav entries in mkdocs.yml that the hook expands into generated sections.
LESSONS_INDEX = "lessons/index.md"
BANK_INDEX = "questions/index.md"
LABS_INDEX = "labs/index.md"
# Hand-written section indexes that end with a card per page of their section.
CARD_INDEXES = (LABS_INDEX, "reference/index.md")

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
    section: list = [BANK_INDEX, study.MISCONCEPTIONS_PAGE]
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


def _section_pages(nav: list, index_uri: str) -> list[str] | None:
    """The pages after `index_uri` in the nav section it opens."""
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else None
        if isinstance(value, list):
            if value and value[0] == index_uri:
                return [v for v in value[1:] if isinstance(v, str)]
            found = _section_pages(value, index_uri)
            if found is not None:
                return found
    return None


def _section_cards(index_uri: str, docs_dir: Path) -> str:
    cards = []
    for uri in _state["card_sections"][index_uri]:
        source = sections.read_source(docs_dir, uri, _state["generated"])
        try:
            cards.append(sections.page_card(source, render.rel_link(index_uri, uri), f"docs/{uri}"))
        except sections.SectionError as err:
            raise PluginError(str(err)) from None
    return sections.cards_markdown(cards)


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


def _removed_names(root: Path) -> dict[str, dict]:
    """The facts file's `removed` section: vLLM names that 0.33 no longer has."""
    import yaml

    data = yaml.safe_load((root / bank_lib.VLLM_FACTS_FILE).read_text(encoding="utf-8"))
    return dict(data.get("removed") or {})


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
    plotting.reset_build()
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
    _state["card_sections"] = {uri: _section_pages(config.nav, uri) or [] for uri in CARD_INDEXES}
    # The 404 page is a theme template: it reads the module summary from here.
    config.extra["modules_summary"] = sections.module_summary(bank).short
    return config


def on_files(files, config):
    bank: bank_lib.Bank = _state["bank"]
    try:
        pages = {
            BANK_INDEX: render.bank_index(bank),
            LESSONS_INDEX: render.lessons_index(bank),
            glossary.PAGE: glossary.glossary_page(_root(config)),
            study.MISCONCEPTIONS_PAGE: study.misconceptions_page(bank, _removed_names(_root(config))),
            # A stand-in, so links to the deck validate; on_post_build writes the real one.
            study.FLASHCARDS_FILE: study.deck_text([]),
        }
        for module in bank.modules:
            pages[f"lessons/part-{module.part}/index.md"] = render.lessons_module_index(bank, module)
            if module.bank:
                pages[f"questions/part-{module.part}/index.md"] = render.bank_module_index(bank, module)
        for bq in bank.questions.values():
            pages[bq.src_uri] = render.question_page(bank, bq)
    except render.LabOutputError as err:
        raise PluginError(f"lab output for the question bank: {err}") from None
    _state["generated"] = pages
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
    if uri in _state["card_sections"]:
        markdown += "\n\n" + _section_cards(uri, Path(config.docs_dir))
    return markdown + "\n\n" + _state["abbreviations"]


# Inline code that is one token (a file name, a flag, a shape name) with nothing to break at
# but its hyphens: docs/stylesheets/extra.css keeps it on one line inside tables.
_ONE_TOKEN_CODE = re.compile(r"<code>([^<\s]{1,80})</code>")


def on_page_content(html, page, config, files):
    slug = page.meta.get("bank_question")
    if slug:
        bq = _state["bank"].questions[slug]
        try:
            _state.setdefault("cards", {})[slug] = study.card(_state["bank"], bq, html, page.canonical_url or page.url)
        except ValueError as err:
            raise PluginError(str(err)) from None
    return _ONE_TOKEN_CODE.sub(r'<code class="code-token">\1</code>', html)


def on_post_build(config):
    """Copy this build's plots into the site, and write the flashcard deck from the rendered question pages."""
    import shutil

    target = Path(config.site_dir) / plotting.SITE_FOLDER
    target.mkdir(parents=True, exist_ok=True)
    for name, path in plotting.BUILT.items():
        shutil.copyfile(path, target / name)

    bank: bank_lib.Bank = _state["bank"]
    cards = _state.get("cards", {})
    if any(bq.slug not in cards for bq in bank.questions.values()):
        return  # `mkdocs serve` rebuilds only changed pages: keep the last full deck
    deck = study.deck_text([cards[slug] for slug in bank.questions])
    deck_path = Path(config.site_dir) / study.FLASHCARDS_FILE
    deck_path.parent.mkdir(parents=True, exist_ok=True)
    deck_path.write_text(deck, encoding="utf-8")


def on_page_context(context, page, config, nav):
    slug = page.meta.get("bank_question")
    repository = config.extra.get("repository", "").rstrip("/")
    if slug and repository:
        bq = _state["bank"].questions[slug]
        page.edit_url = f"{repository}/edit/main/{bq.path}"
    return context
