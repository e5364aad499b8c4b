"""Helpers shared by the site tests: build a site in a subprocess, read its HTML.

Builds run in a subprocess with torch and triton made unimportable, so every
site test also proves that the site never needs them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

# `import torch` raises ImportError once sys.modules holds None for it.
BUILD_WITHOUT_TORCH = (
    "import sys; sys.modules['torch'] = None; sys.modules['triton'] = None; "
    "from mkdocs.__main__ import cli; cli()"
)


def mkdocs_build(project: Path, out: Path, strict: bool = True, site_url: str | None = None
                 ) -> subprocess.CompletedProcess:
    args = [sys.executable, "-c", BUILD_WITHOUT_TORCH, "build", "-d", str(out)]
    if strict:
        args.append("--strict")
    env = {key: value for key, value in os.environ.items() if key != "SITE_URL"}
    if site_url:
        env["SITE_URL"] = site_url  # mkdocs.yml: site_url: !ENV SITE_URL
    return subprocess.run(args, cwd=project, capture_output=True, text=True, timeout=600,
                          env={**env, "NO_MKDOCS_2_WARNING": "1"})


_SESSION_SITE: dict[str, Path] = {}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def session_site(tmp_path_factory) -> Path:
    """The real site, built once per test session and shared by every module that asks.

    A session fixture defined in two test modules would build twice; both
    modules' fixtures call this instead. The build is strict, without -q, with
    torch and triton unimportable, and must print no warning. Its site_url is
    the address the browser tests serve it on (`session_site_url`), because
    Material's instant navigation only follows links of its own site_url.
    """
    if "site" not in _SESSION_SITE:
        out = tmp_path_factory.mktemp("site")
        url = f"http://127.0.0.1:{_free_port()}/"
        start = time.perf_counter()
        result = mkdocs_build(ROOT, out, strict=True, site_url=url)
        seconds = time.perf_counter() - start
        assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr[-5000:]}"
        warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
        assert not warnings, "\n".join(warnings)
        print(f"\nfull site built in {seconds:.1f} s (torch and triton unimportable)")
        _SESSION_SITE["site"], _SESSION_SITE["url"] = out, url
    return _SESSION_SITE["site"]


def session_site_url() -> str:
    """The address `session_site` was built for: serve it there."""
    return _SESSION_SITE["url"]


# Files a minimal copy of the site needs besides its content.
SITE_MACHINERY = ["mkdocs.yml", "macros.py", "docs/.hooks", "docs/.data", "docs/.overrides", "labs",
                  "docs/stylesheets", "docs/javascripts"]
# Pages rendered from the data files alone (no links to lessons or questions): copied whole,
# since generated pages (the misconceptions index) link their anchors.
GENERATED_FROM_DATA = ["docs/reference/vllm-facts.md"]


class _AnyTagLoader(yaml.SafeLoader):
    """Reads mkdocs.yml, whose `!!python/name:` tags the safe loader refuses."""


_AnyTagLoader.add_multi_constructor("", lambda loader, suffix, node: None)


def _nav_pages(nav) -> list[str]:
    out: list[str] = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


# The one lesson of the fixture sites in test_bank.py and test_bank_cases.py. VERSION is replaced by
# the facts file's vLLM version; "Real section" is the anchor a case links to.
FIXTURE_LESSON = """\
---
title: Alpha lesson
description: A lesson for the fixture site.
order: 10
verified: {date: 2026-11-29, vllm: VERSION}
---
# Alpha lesson

## Real section

Body.
"""


def copy_site(dest: Path) -> Path:
    """The site's machinery, with a stub for each hand-written page of the nav and no lessons or questions.

    Stubs, not the real pages: real pages link real lessons and questions, which a
    fixture site does not have.
    """
    for rel in SITE_MACHINERY:
        src = ROOT / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__", "results"))
        elif src.exists():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_AnyTagLoader)
    for uri in _nav_pages(config["nav"]):
        if (ROOT / "docs" / uri).is_file():
            stub = dest / "docs" / uri
            stub.parent.mkdir(parents=True, exist_ok=True)
            # A description, as every page a section index lists needs one.
            stub.write_text(f"---\ndescription: Stub of {uri}.\n---\n# {Path(uri).stem}\n", encoding="utf-8")
    for rel in GENERATED_FROM_DATA:
        shutil.copy2(ROOT / rel, dest / rel)
    (dest / "questions").mkdir(exist_ok=True)
    (dest / "docs" / "lessons").mkdir(parents=True, exist_ok=True)
    return dest


@dataclass
class Page:
    path: Path
    ids: set[str] = field(default_factory=set)
    links: list[tuple[str, int]] = field(default_factory=list)  # (href, line)
    headings: list[tuple[str, str, str]] = field(default_factory=list)  # (tag, id, text)


class _PageParser(HTMLParser):
    def __init__(self, page: Page):
        super().__init__(convert_charrefs=True)
        self.page = page
        self._heading: list | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.page.ids.add(attrs["id"])
        if tag == "a" and attrs.get("name"):
            self.page.ids.add(attrs["name"])
        for attr in ("href", "src"):
            if attrs.get(attr) and tag in ("a", "link", "script", "img", "iframe", "source"):
                self.page.links.append((attrs[attr], self.getpos()[0]))
        if tag in ("h1", "h2", "h3") and self._heading is None:
            self._heading = [tag, attrs.get("id", ""), ""]

    def handle_data(self, data):
        if self._heading is not None:
            self._heading[2] += data

    def handle_endtag(self, tag):
        if self._heading is not None and tag == self._heading[0]:
            tag_, id_, text = self._heading
            self.page.headings.append((tag_, id_, text.replace("¶", "").strip()))
            self._heading = None


def parse_site(site: Path) -> dict[str, Page]:
    """Every HTML page of a built site, keyed by its path relative to the site root."""
    pages = {}
    for path in sorted(site.rglob("*.html")):
        page = Page(path)
        _PageParser(page).feed(path.read_text(encoding="utf-8"))
        pages[path.relative_to(site).as_posix()] = page
    return pages


def article_html(path: Path) -> str:
    """The page's main content (Material's <article>), without the navigation around it."""
    text = path.read_text(encoding="utf-8")
    start = text.index("<article")
    return text[start:text.index("</article>", start)]
