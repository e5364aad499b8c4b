"""The real site, built once per test session, checked as a reader would meet it.

The build runs with torch and triton unimportable, strict, without -q (which
would hide warnings from strict's counter). The tests then read the built HTML:
sections in order on every question page, links both ways between questions
and lessons, every internal link and #anchor resolving (including those in
templates and raw HTML, which MkDocs' own validation does not see), and every
page reachable from the navigation.
"""

from __future__ import annotations

import html as html_lib
import re
import posixpath
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("pydantic")

from site_helpers import ROOT, article_html, parse_site, session_site  # noqa: E402

sys.path.insert(0, str(ROOT / "docs" / ".hooks"))
import bank as bank_lib  # noqa: E402
from bank_render import QUESTION_SECTIONS  # noqa: E402


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> Path:
    return session_site(tmp_path_factory)  # one build per session, shared with test_browser.py


@pytest.fixture(scope="session")
def pages(built):
    return parse_site(built)


@pytest.fixture(scope="session")
def bank():
    return bank_lib.load_bank(ROOT)


def _page_path(src_uri: str) -> str:
    """Built HTML path of a source page (use_directory_urls)."""
    stem = src_uri[:-3]
    return "index.html" if stem == "index" else (stem[:-5] if stem.endswith("/index") else stem + "/") + "index.html"


def test_bank_is_not_empty(bank):
    assert bank.questions and bank.lessons


def test_every_question_page_has_its_sections_in_order(bank, pages):
    for bq in bank.questions.values():
        page = pages[_page_path(bq.src_uri)]
        h2 = [text for tag, _, text in page.headings if tag == "h2"]
        expected = [s for s in QUESTION_SECTIONS if s != "Code" or bq.q.code is not None]
        assert h2 == expected, f"{bq.path}: sections {h2}, expected {expected}"
        h3 = [text for tag, _, text in page.headings if tag == "h3"]
        assert len(h3) == len(bq.q.follow_ups), f"{bq.path}: one heading per follow-up"


def _resolve(from_page: str, href: str) -> tuple[str, str] | None:
    """(target html path, fragment) of an internal link, or None for external ones."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc or href.startswith(("mailto:", "javascript:", "data:")):
        return None
    base = posixpath.dirname(from_page)
    if parts.path.startswith("/"):  # root-relative (the 404 page's links): the site is served at /
        base, parts = "", parts._replace(path="." + parts.path)
    target = posixpath.normpath(posixpath.join(base, unquote(parts.path))) if parts.path else from_page
    if parts.path.endswith("/") or parts.path == "":
        target = from_page if not parts.path else posixpath.join(target, "index.html")
    elif parts.path in (".", ".."):
        target = posixpath.join(target, "index.html")
    return target, unquote(parts.fragment)


def protocol_relative_to_this_site(href: str, top_level: set[str]) -> bool:
    """`//lessons/x`: a path of this site written with a leading `//`, which browsers read as a host."""
    if not href.startswith("//"):
        return False
    host = urlsplit(href).netloc
    return "." not in host or host in top_level  # a real external host has a dot in its name


def test_zero_broken_internal_links_and_anchors(built, pages):
    broken = []
    top_level = {p.name for p in built.iterdir()}
    for name, page in pages.items():
        for href, line in page.links:
            if protocol_relative_to_this_site(href, top_level):
                broken.append(f"{name}:{line}: {href} is protocol-relative: it names the host "
                              f"{urlsplit(href).netloc!r}, not this site's page")
                continue
            resolved = _resolve(name, href)
            if resolved is None:
                continue
            target, fragment = resolved
            if not (built / target).exists():
                if (built / target).with_suffix("").is_dir() or (built / target / "index.html").exists():
                    target = posixpath.join(target, "index.html")
                else:
                    broken.append(f"{name}:{line}: {href} -> missing {target}")
                    continue
            if fragment and target.endswith(".html") and fragment not in pages[target].ids:
                broken.append(f"{name}:{line}: {href} -> no #{fragment} in {target}")
    assert not broken, f"{len(broken)} broken internal link(s):\n" + "\n".join(broken[:50])


def test_links_between_questions_and_lessons_go_both_ways(bank, built):
    for bq in bank.questions.values():
        question_html = article_html(built / _page_path(bq.src_uri))
        for lesson_id in bq.lessons:
            lesson = bank.lessons[lesson_id]
            href_to_lesson = posixpath.relpath(_page_path(lesson.src_uri)[:-len("index.html")],
                                               _page_path(bq.src_uri)[:-len("index.html")]) + "/"
            assert f'href="{href_to_lesson}"' in question_html, f"{bq.path}: no link to {lesson_id}"
            lesson_html = article_html(built / _page_path(lesson.src_uri))
            links_section = lesson_html[lesson_html.index('id="interview-links"'):]
            href_back = posixpath.relpath(_page_path(bq.src_uri)[:-len("index.html")],
                                          _page_path(lesson.src_uri)[:-len("index.html")]) + "/"
            assert f'href="{href_back}"' in links_section, f"{lesson.path}: Interview links miss {bq.slug}"


def test_every_lesson_ends_with_interview_links_then_sources(bank, built):
    """The build's footer: Interview links, then Sources (where the lesson has any), and nothing after."""
    for lesson in bank.lessons.values():
        html = article_html(built / _page_path(lesson.src_uri))
        assert 'id="interview-links"' in html, lesson.path
        ids = re.findall(r'<h2 id="([^"]+)"', html)
        want = ["interview-links", "sources"] if lesson.meta.sources else ["interview-links"]
        assert ids[-len(want):] == want, f"{lesson.path}: last sections are {ids[-3:]}, want {want}"


def test_every_page_is_reachable_from_the_navigation(built, pages):
    home = (built / "index.html").read_text(encoding="utf-8")
    # The primary navigation sidebar runs from its <nav> to the content column.
    nav = home[home.index("md-nav--primary"):home.index('<div class="md-content"')]
    linked = {target for href, _ in pages["index.html"].links
              if (r := _resolve("index.html", href)) and href in nav for target in [r[0]]}
    content_pages = {name for name in pages if name not in ("404.html",) and not name.startswith("assets/")}
    missing = sorted(p for p in content_pages if p not in linked and p != "index.html")
    assert not missing, f"pages not in the navigation: {missing}"


def test_question_edit_link_points_at_its_yaml(bank, built):
    bq = next(iter(bank.questions.values()))
    html = (built / _page_path(bq.src_uri)).read_text(encoding="utf-8")
    assert f"/edit/main/{bq.path}" in html


def test_bank_index_lists_every_question_by_module(bank, built):
    html = article_html(built / "questions/index.html")
    for bq in bank.questions.values():
        assert f'href="{bq.id}/"' in html, f"{bq.slug} missing from /questions/"
    for module in bank.modules:
        assert (html_lib.escape(module.label, quote=False) in html) == module.bank, module.label


def test_module_without_lessons_shows_as_planned(bank, built):
    for module in bank.modules:
        html = article_html(built / f"lessons/part-{module.part}/index.html")
        if not bank.lessons_of(module.part):
            assert "Planned" in html, module.label


def test_404_page_helps(built):
    html = (built / "404.html").read_text(encoding="utf-8")
    for target in ("lessons/", "questions/"):
        assert target in html


def _text(html_text: str) -> str:
    return re.sub(r"\s+", " ", html_lib.unescape(re.sub(r"<[^>]+>", " ", html_text)))


def test_module_counts_come_from_the_lessons(bank, built):
    """Home, Lessons and 404 say how many modules have lessons, and name the planned ones."""
    import sections

    summary = sections.module_summary(bank)
    written = [m for m in bank.modules if bank.lessons_of(m.part)]
    assert summary.written == written
    home = _text(article_html(built / "index.html"))
    lessons = _text(article_html(built / "lessons/index.html"))
    not_found = _text((built / "404.html").read_text(encoding="utf-8"))
    for text in (home, lessons):
        assert summary.sentence in text
    assert summary.short in not_found
    if summary.planned:
        for text in (home, lessons, not_found):
            assert "Nine modules" not in text and "nine modules," not in text
            assert "planned" in text
        assert sections.parts_phrase([m.part for m in summary.planned]) in summary.sentence


def _cards(html_text: str) -> list[tuple[str, str]]:
    """(href, text) of every card of a section index."""
    block = html_text[html_text.index('class="grid cards section-cards"'):]
    block = block[:block.index("</ul>")]
    return [(m.group(1), _text(m.group(0))) for m in re.finditer(r'<li>\s*<p><a href="([^"]+)">.*?</li>', block, re.S)]


@pytest.mark.parametrize("folder", ["labs", "reference"])
def test_section_index_has_a_card_per_page(built, pages, folder):
    html = article_html(built / folder / "index.html")
    cards = _cards(html)
    built_pages = sorted(p.split("/")[1] for p in pages if p.startswith(folder + "/") and p.count("/") == 2)
    assert sorted(href.rstrip("/") for href, _ in cards) == built_pages
    for href, text in cards:
        assert len(text.split()) >= 6, f"{folder}/{href}: the card has no line about the page"


def test_module_index_has_a_card_per_lesson(bank, built):
    for module in bank.modules:
        lessons = bank.lessons_of(module.part)
        if lessons:
            cards = _cards(article_html(built / f"lessons/part-{module.part}/index.html"))
            assert [href for href, _ in cards] == [f"{lesson.slug}/" for lesson in lessons], module.label
            for (_, text), lesson in zip(cards, lessons):
                assert lesson.meta.description.split()[0] in text


def test_protocol_relative_links_are_caught():
    top = {"lessons", "questions", "assets"}
    assert protocol_relative_to_this_site("//lessons/", top)
    assert protocol_relative_to_this_site("//assets.x/a", {"assets.x"})
    assert not protocol_relative_to_this_site("//fonts.example.org/a.css", top)
    assert not protocol_relative_to_this_site("/lessons/", top)


def _links_404(html: str) -> list[str]:
    import re

    main = html[html.index("Page not found"):]
    return re.findall(r'<a href="([^"]+)"', main[: main.index("</ul>")])


def test_404_page_links_resolve_from_any_depth(built):
    """Served for any missing address, at any depth: its links are absolute paths of this site."""
    links = _links_404((built / "404.html").read_text(encoding="utf-8"))
    assert links == ["/lessons/", "/questions/", "/labs/", "/"], links
    for href in links:
        assert (built / href.lstrip("/") / "index.html").is_file(), href


def test_404_page_under_a_site_url_with_a_path(tmp_path):
    """Published at https://host/bank/, the 404 page's links keep the /bank/ prefix."""
    from site_helpers import copy_site, mkdocs_build

    root = copy_site(tmp_path / "site")
    result = mkdocs_build(root, tmp_path / "out", strict=True, site_url="https://example.org/interview-bank/")
    assert result.returncode == 0, result.stderr[-3000:]
    links = _links_404((tmp_path / "out/404.html").read_text(encoding="utf-8"))
    assert links == ["/interview-bank/lessons/", "/interview-bank/questions/", "/interview-bank/labs/",
                     "/interview-bank/"], links
    for href in links:
        assert (tmp_path / "out" / href.removeprefix("/interview-bank/") / "index.html").is_file(), href
