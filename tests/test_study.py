"""Study tools: the misconceptions index and the flashcard deck, read back from the built site."""

from __future__ import annotations

import sys

import pytest
import yaml

pytest.importorskip("mkdocs")
pytest.importorskip("pydantic")

from site_helpers import ROOT, session_site  # noqa: E402

sys.path.insert(0, str(ROOT / "docs" / ".hooks"))
import bank as bank_lib  # noqa: E402
import study  # noqa: E402


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    return session_site(tmp_path_factory)


@pytest.fixture(scope="module")
def bank():
    return bank_lib.load_bank(ROOT)


def _page(built, src_uri: str) -> str:
    return (built / src_uri.removesuffix(".md") / "index.html").read_text(encoding="utf-8")


def test_deck_round_trips_quotes_and_markup():
    cards = [study.Card('Why "decode"?<br><small>concept · Part 0</small>', '<p>He said "x"\ty</p>', "part-0 concept"),
             study.Card("Plain", "", "part-5 numbers")]
    assert study.read_deck(study.deck_text(cards)) == cards


def test_section_html_stops_at_the_next_heading():
    page = '<h2 id="short-answer">Short answer</h2><p>one</p><h2 id="direct-answer">D</h2><p>two</p>'
    assert study.section_html(page, "short-answer") == "<p>one</p>"
    assert study.section_html(page, "direct-answer") == "<p>two</p>"
    assert study.section_html(page, "deep-dive") is None


def test_the_deck_holds_every_question_once_with_its_rendered_answers(built, bank):
    deck = (built / study.FLASHCARDS_FILE).read_text(encoding="utf-8")
    cards = study.read_deck(deck)
    assert len(cards) == len(bank.questions)
    by_front = {study.plain_text(c.front.split("<br>")[0]): c for c in cards}
    for bq in bank.questions.values():
        card = by_front[bq.q.title]
        page = _page(built, bq.src_uri)
        short = study.plain_text(study.section_html(page, "short-answer"))
        assert short and short in study.plain_text(card.back), bq.path
        assert "{{" not in card.back, f"{bq.path}: a macro reached the card unrendered"
        assert f"part-{bq.q.part}" in card.tags.split() and bq.q.kind in card.tags.split()
        assert bq.q.kind in card.front


def test_the_bank_index_links_the_deck_and_the_misconceptions_index(built):
    index = (built / "questions" / "index.html").read_text(encoding="utf-8")
    assert 'href="flashcards.txt"' in index
    assert 'href="misconceptions/"' in index


def test_misconceptions_index_lists_every_belief_and_every_removed_name(built, bank):
    page = study.plain_text(_page(built, study.MISCONCEPTIONS_PAGE)).lower()
    beliefs = [b for bq in bank.questions.values() for b in bq.q.misconceptions]
    assert beliefs, "no question lists a misconception: the index would only hold removed names"
    for belief in beliefs:
        assert study.plain_text(belief.rstrip(".")).lower() in page, belief
    removed = yaml.safe_load((ROOT / "labs" / "data" / "vllm.yaml").read_text(encoding="utf-8"))["removed"]
    for name in removed:
        assert name.lower() in page, f"removed name {name} is missing from the misconceptions index"


def test_a_removed_name_links_the_pages_that_explain_it(bank):
    mentions = study.removed_mentions(bank)
    swap = {m.src_uri for m in mentions["--swap-space"]}
    assert "lessons/part-5/preemption-recompute-vs-swap.md" in swap
    assert "questions/part-5/preemption-recompute-vs-swap.md" in swap
