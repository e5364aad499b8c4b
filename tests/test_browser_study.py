"""Study tools in a real browser: bank filters, the random drill, keyboard shortcuts, the deck download.

Runs on the fixtures of test_browser.py (the system Chromium, the session's
strict build served on 127.0.0.1, every request and console error recorded), at
a desktop and a phone width.
"""

from __future__ import annotations

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("pydantic")

from test_browser import (  # noqa: E402,F401  (fixtures are found by name)
    bank,
    base_url,
    browser,
    context,
    expect,
    page,
    playwright_api,
    recorder,
    shot,
    site,
)

import study  # noqa: E402  (docs/.hooks is on sys.path through test_browser)

WIDTHS = {"desktop": 1280, "phone": 390}


@pytest.fixture(params=list(WIDTHS))
def sized(request, page):
    page.set_viewport_size({"width": WIDTHS[request.param], "height": 900})
    page.width_name = request.param
    return page


def _rows(page):
    return page.locator("article table tbody tr")


def _visible_kinds(page) -> set[str]:
    kinds = set()
    for row in _rows(page).all():
        if row.is_visible():
            kinds.add(row.locator("td").nth(1).inner_text().strip())
    return kinds


def test_filters_by_kind_and_module_and_remember_the_choice(sized, base_url, bank):
    page = sized
    page.goto(base_url + "questions/")
    expect(page.locator(".bank-study__filters")).to_be_visible()
    total = len(bank.questions)
    expect(page.locator(".bank-study__count")).to_have_text(f"{total} of {total} questions shown")
    for kind in ("concept", "debug", "design"):
        page.locator(f'.bank-study__kind[value="{kind}"]').uncheck()
    numbers = [bq for bq in bank.questions.values() if bq.q.kind == "numbers"]
    assert numbers, "the bank has no numbers question to filter on"
    expect(page.locator(".bank-study__count")).to_have_text(f"{len(numbers)} of {total} questions shown")
    assert _visible_kinds(page) == {"numbers"}
    part = f"part-{numbers[0].q.part}"
    page.locator(".bank-study__module").select_option(part)
    expected = [bq for bq in numbers if f"part-{bq.q.part}" == part]
    expect(page.locator(".bank-study__count")).to_have_text(f"{len(expected)} of {total} questions shown")
    shot(page, f"study-filters-{page.width_name}", full_page=False)
    page.reload()
    expect(page.locator(".bank-study__count")).to_have_text(f"{len(expected)} of {total} questions shown")
    assert page.locator(".bank-study__module").input_value() == part


def test_drill_picks_from_the_filter_and_survives_instant_navigation(sized, base_url, bank):
    page = sized
    page.goto(base_url + "questions/")
    for kind in ("concept", "numbers", "design"):
        page.locator(f'.bank-study__kind[value="{kind}"]').uncheck()
    debug = {bq.id for bq in bank.questions.values() if bq.q.kind == "debug"}
    page.locator(".bank-study__drill").click()
    page.wait_for_url("**/questions/part-*/*/")
    first = page.locator(".bank-practice--bar").get_attribute("data-question")
    assert first in debug
    expect(page.locator(".bank-study__next")).to_be_visible()
    for _ in range(3):  # each hop is an instant navigation; the drill bar must come back every time
        page.locator(".bank-study__next").click()
        page.wait_for_function("id => document.querySelector('.bank-practice--bar') && "
                               "document.querySelector('.bank-study__next')", arg=first)
        assert page.locator(".bank-practice--bar").get_attribute("data-question") in debug
    shot(page, f"study-drill-{page.width_name}", full_page=False)


def test_drill_favours_missed_and_shaky_questions(page, base_url):
    page.goto(base_url + "questions/")
    picks = page.evaluate("""() => {
        localStorage.setItem('llm-bank.marks', JSON.stringify({a: 'missed', b: 'knew'}));
        const pick = window.llmBankStudy.pick;
        return [pick(['a', 'b'], null, () => 0.7), pick(['a', 'b'], null, () => 0.9),
                pick(['a', 'b'], 'a', () => 0.1)];
    }""")
    # weights 4 (missed) and 1 (knew): a roll of 0.7 × 5 = 3.5 lands on a, 0.9 × 5 = 4.5 on b;
    # excluding the current question leaves b.
    assert picks == ["a", "b", "b"]


def test_keyboard_reveals_and_marks(sized, base_url, bank):
    page = sized
    bq = next(iter(bank.questions.values()))
    page.goto(base_url + bq.src_uri.removesuffix(".md") + "/")
    page.locator(".bank-switch").first.click()  # practice mode: answers hidden
    hidden_before = page.locator(".bank-answer--hidden").count()
    assert hidden_before > 1
    page.keyboard.press("r")
    expect(page.locator(".bank-answer--hidden")).to_have_count(hidden_before - 1)
    page.keyboard.press("2")
    expect(page.locator('.bank-mark[data-mark="shaky"]')).to_have_attribute("aria-pressed", "true")
    marks = page.evaluate("() => JSON.parse(localStorage.getItem('llm-bank.marks'))")
    assert marks == {bq.id: "shaky"}


def test_flashcard_deck_downloads_from_the_bank_index(sized, base_url, bank):
    page = sized
    page.goto(base_url + "questions/")
    link = page.locator('article a[download][href$="flashcards.txt"]')
    expect(link).to_be_visible()
    with page.expect_download() as info:
        link.click()  # the link carries `download`, so the browser saves it instead of showing it
    path = info.value.path()
    cards = study.read_deck(open(path, encoding="utf-8").read())
    assert len(cards) == len(bank.questions)
