"""What the section index pages and the home page say about the sections: derived, never typed.

Two things live here. The module summary ("Five of the nine modules have
lessons ...") is counted from the lessons that exist, so the home, Lessons and
404 pages cannot claim a module that is still empty. The cards of a section
index (Labs, Reference, a module) list its pages, one line each, from each
page's own front matter (`title`, else its first heading; `description`), so a
new page shows up on its section's index by being added to the folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from bank import Bank, Module

_WORDS = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?\n)---\s*\n", re.S)
_HEADING = re.compile(r"^#\s+(.+?)\s*$", re.M)


class SectionError(ValueError):
    """A page a section index lists gives it nothing to show."""


def number_word(n: int) -> str:
    return _WORDS[n] if 0 <= n < len(_WORDS) else f"{n:,}"


def parts_phrase(parts: list[int]) -> str:
    """[0, 1, 2, 3, 5] -> '0–3 and 5', [0, 1, 2, 7, 8] -> '0–2, 7 and 8': three or more in a row as a range."""
    runs: list[list[int]] = []
    for p in sorted(parts):
        if runs and p == runs[-1][-1] + 1:
            runs[-1].append(p)
        else:
            runs.append([p])
    items: list[str] = []
    for r in runs:  # three or more in a row make a range; one or two stay single numbers
        items += [f"{r[0]}–{r[-1]}"] if len(r) > 2 else [str(p) for p in r]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _parts_word(parts: list[int]) -> str:
    single = len(parts) == 1
    return ("Part " if single else "Parts ") + parts_phrase(parts)


@dataclass(frozen=True)
class ModuleSummary:
    written: list[Module]  # modules with at least one lesson, in order
    planned: list[Module]  # modules with none yet

    @property
    def sentence(self) -> str:
        """For the home and Lessons pages: the count, the span, and what is still to come."""
        total = len(self.written) + len(self.planned)
        if not self.written:
            return f"{number_word(total).capitalize()} modules are planned; none has lessons yet."
        first, last = self.written[0], self.written[-1]
        span = f"from {_parts_word([first.part])}, {first.name}, to {_parts_word([last.part])}, {last.name}"
        if not self.planned:
            return f"{number_word(total).capitalize()} modules, {span}."
        written = [m.part for m in self.written]
        planned = [m.part for m in self.planned]
        verb = "is" if len(planned) == 1 else "are"
        return (f"{number_word(len(self.written)).capitalize()} of the {number_word(total)} modules have lessons "
                f"({_parts_word(written)}), {span}; {_parts_word(planned)} {verb} planned.")

    @property
    def short(self) -> str:
        """For a one-line link (the 404 page)."""
        written = _parts_word([m.part for m in self.written]) if self.written else "none yet"
        if not self.planned:
            return f"{number_word(len(self.written))} modules, {written}"
        planned = [m.part for m in self.planned]
        return f"{written} have lessons; {_parts_word(planned)} {'is' if len(planned) == 1 else 'are'} planned"


def module_summary(bank: Bank) -> ModuleSummary:
    written = [m for m in bank.modules if bank.lessons_of(m.part)]
    planned = [m for m in bank.modules if not bank.lessons_of(m.part)]
    return ModuleSummary(written, planned)


# ---------------------------------------------------------------------------
# Cards: one per page of a section
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Card:
    title: str
    href: str  # relative Markdown link target
    line: str  # one line: what the page holds


def page_card(source: str, href: str, where: str) -> Card:
    """A page's card from its Markdown source: front-matter title (else its first heading) and description."""
    match = _FRONT_MATTER.match(source)
    meta = (yaml.safe_load(match.group(1)) or {}) if match else {}
    body = source[match.end():] if match else source
    title = meta.get("title")
    if not title:
        heading = _HEADING.search(body)
        title = heading.group(1) if heading else None
    if not title or "{{" in title:
        raise SectionError(f"{where}: give the page a plain `title:` in its front matter (the section index "
                           "shows it)")
    line = meta.get("description")
    if not line:
        raise SectionError(f"{where}: add a one-line `description:` to its front matter (the section index "
                           "shows it)")
    return Card(str(title), href, " ".join(str(line).split()))


def cards_markdown(cards: list[Card]) -> str:
    """Material's grid cards: a title that links, then one line."""
    items = [f"-   [**{c.title}**]({c.href})\n\n    {c.line}" for c in cards]
    return '<div class="grid cards section-cards" markdown>\n\n' + "\n\n".join(items) + "\n\n</div>"


def read_source(docs_dir: Path, uri: str, generated: dict[str, str]) -> str:
    if uri in generated:
        return generated[uri]
    return (docs_dir / uri).read_text(encoding="utf-8")
