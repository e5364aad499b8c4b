"""The built site in a real browser: what a reader clicks, sees and stores.

Headless Chromium (the system one: $CHROMIUM_PATH, else /usr/bin/chromium)
driven by Playwright, against the session's strict build served on
127.0.0.1. Every page of every test records its requests and console errors:
a request to any other host, or any console error, fails the test that made
it. Screenshots go to test-artifacts/screenshots/ (git-ignored) for a person to
look at.

Without Playwright or Chromium the tests skip with the reason, except under
CI=true, where that is a failure (tests/conftest.py `require_or_skip`).
"""

from __future__ import annotations

import functools
import html
import http.server
import json
import os
import re
import sys
import threading
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("pydantic")

from conftest import require_or_skip  # noqa: E402
from site_helpers import ROOT, session_site, session_site_url  # noqa: E402

# The labs the calculator is checked against are the ones this checkout built the site from.
sys.path[:0] = [str(ROOT), str(ROOT / "docs" / ".hooks")]
import bank as bank_lib  # noqa: E402

CHROMIUM = os.environ.get("CHROMIUM_PATH") or "/usr/bin/chromium"
# No first-run UI, and no traffic of Chromium's own (updates, sync, safe browsing):
# every request the tests see comes from the page.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
HOST = "127.0.0.1"
TIMEOUT_MS = 15_000

# The calculator is checked against the Python lab on these GPUs, for every model.
CALCULATOR_GPUS = ["h200", "h100-sxm", "l40s"]
# Fields of labs.kv_sizing.budget() the calculator must reproduce exactly.
CALCULATOR_FIELDS = ["kv_bytes_per_token", "layer_bytes_per_token", "bytes_per_block", "total_memory",
                     "requested_memory", "weights", "activation_peak", "non_torch", "cudagraph", "kv_pool",
                     "num_blocks", "blocks_per_request", "kv_bytes_per_sequence", "kv_cache_tokens",
                     "max_num_seqs", "max_num_batched_tokens", "block_size", "kv_cache_dtype",
                     "fits_one_request", "estimated_max_model_len"]


# ---------------------------------------------------------------------------
# Fixtures: the browser, the served site, a page that records what it does
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def playwright_api():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require_or_skip(False, "playwright", "pip install playwright (in the `test` extra)")
    require_or_skip(os.access(CHROMIUM, os.X_OK), "Chromium",
                    f"no executable at {CHROMIUM}; apt-get install chromium, or set CHROMIUM_PATH")
    with sync_playwright() as api:
        yield api


@pytest.fixture(scope="module")
def browser(playwright_api):
    browser = playwright_api.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def site(playwright_api, tmp_path_factory) -> Path:
    # Asks for the browser first: without one, skip before spending a build.
    return session_site(tmp_path_factory)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def base_url(site):
    """The site served where it was built to live (its site_url), so instant navigation is on."""
    url = session_site_url()
    port = urlsplit(url).port
    server = http.server.ThreadingHTTPServer((HOST, port), functools.partial(_QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield url
    server.shutdown()
    server.server_close()


class Recorder:
    """Every request and console error of one browser context."""

    def __init__(self):
        self.requests: list[str] = []
        self.errors: list[str] = []

    def foreign(self) -> list[str]:
        return [url for url in self.requests
                if urlsplit(url).scheme in ("http", "https", "ws", "wss") and urlsplit(url).hostname != HOST]

    def attach(self, page):
        page.on("console", lambda msg: msg.type == "error" and self.errors.append(f"{page.url}: {msg.text}"))
        page.on("pageerror", lambda err: self.errors.append(f"{page.url}: uncaught {err}"))
        return page


@pytest.fixture
def recorder():
    return Recorder()


@pytest.fixture
def context(browser, recorder, base_url):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, service_workers="block")
    ctx.set_default_timeout(TIMEOUT_MS)
    ctx.on("request", lambda request: recorder.requests.append(request.url))
    # Anything bound elsewhere is refused here (and recorded above), so a leak fails fast, not by timeout.
    ctx.route(lambda url: urlsplit(url).hostname not in (HOST, None), lambda route: route.abort())
    yield ctx
    ctx.close()
    assert not recorder.foreign(), f"requests to other hosts: {sorted(set(recorder.foreign()))}"
    assert not recorder.errors, "console errors:\n" + "\n".join(recorder.errors)


@pytest.fixture
def page(context, recorder):
    return recorder.attach(context.new_page())


def expect(locator):
    """Playwright's retrying assertions (imported here: the module must import without Playwright)."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def heading(page):
    """The page's own title: the h1 of the content (search results hold h1s too)."""
    return page.locator(".md-content__inner > h1")


def shot(page, name: str, **kwargs) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), **kwargs)
    return path


# ---------------------------------------------------------------------------
# What the tests need from the bank and the built site
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bank():
    return bank_lib.load_bank(ROOT)


def _url_of(src_uri: str) -> str:
    """Site path of a source page (use_directory_urls)."""
    stem = src_uri[:-3]
    if stem == "index":
        return ""
    return (stem[:-len("index")] if stem.endswith("/index") else stem + "/")


def _question_with_lesson(bank) -> bank_lib.BankQuestion:
    """The first question by id: a fixed choice, so a failure names the same page every run."""
    return sorted(bank.questions.values(), key=lambda bq: bq.id)[0]


def _plain(html_text: str) -> str:
    """What a reader reads: no tags, no TeX source, no code; a removed piece breaks the phrase there."""
    text = re.sub(r"<code[^>]*>.*?</code>|\\\(.*?\\\)|\\\[.*?\\\]", " | ", html_text, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", text)))


def _answer_phrase(site: Path, question_url: str) -> str:
    """Three consecutive words of a question's direct answer, chosen as a reader would: the rarest on the site.

    Search matches words, not phrases, and ranks a word in a title first, so the
    phrase whose words appear in no title and on the fewest pages is the one
    that should find this question first.
    """
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))["docs"]
    section = next(d for d in index if d["location"] == question_url + "#direct-answer")
    phrases = []
    for clause in re.split(r"[|.;:()]", _plain(section["text"])):  # a phrase stays inside one clause
        words = re.findall(r"\b[A-Za-z]{4,}\b", clause)
        phrases += [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
    assert phrases, f"{question_url}: no three plain words in a row in its direct answer to search for"
    pages: dict[str, set[str]] = {}  # the index holds one entry per section: gather them by page
    titles: set[str] = set()  # the search ranks a word in a title far above one in the text
    for doc in index:
        words = re.findall(r"[a-z]+", _plain(doc["text"]).lower())
        pages.setdefault(doc["location"].split("#")[0], set()).update(words)
        titles.update(re.findall(r"[a-z]+", _plain(doc["title"]).lower()))

    def pages_with(word: str) -> int:
        return sum(word.lower() in words for words in pages.values()) + 1000 * (word.lower() in titles)

    return " ".join(min(phrases, key=lambda words: (sum(map(pages_with, words)), phrases.index(words))))


def _page_with(site: Path, *needles: str) -> str:
    """The URL path (relative to the site root) of the first built page whose HTML holds every needle."""
    for path in sorted(site.rglob("index.html")):
        if all(n in path.read_text(encoding="utf-8") for n in needles):
            rel = path.parent.relative_to(site).as_posix()
            return "" if rel == "." else rel + "/"
    pytest.fail(f"no page of the built site contains all of {needles}")


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


def test_home_page_and_theme(page, base_url):
    page.goto(base_url)
    assert page.title().endswith("LLM Inference Interview Bank")
    shot(page, "home")
    # The palette toggle switches to dark and back; code copy buttons and abbreviations are live.
    scheme = page.get_attribute("body", "data-md-color-scheme")
    page.locator("form[data-md-component=palette] label:visible").first.click()
    page.wait_for_function(f"document.body.getAttribute('data-md-color-scheme') !== {json.dumps(scheme)}")
    shot(page, "home-dark")
    page.locator("form[data-md-component=palette] label:visible").first.click()
    page.wait_for_function(f"document.body.getAttribute('data-md-color-scheme') === {json.dumps(scheme)}")


def test_abbreviations_show_their_expansion(page, base_url, site):
    url = _page_with(site, "<abbr", "<h2")
    page.goto(base_url + url)
    abbr = page.locator("article abbr").first
    abbr.hover()
    # Material's content.tooltips turns the title into a tooltip element on hover.
    tooltip = page.locator(".md-tooltip2--active, .md-tooltip2").filter(has_text=re.compile(r"\w"))
    tooltip.first.wait_for(state="visible")


def test_search_finds_a_question_by_a_phrase_from_its_answer(page, base_url, site, bank):
    bq = _question_with_lesson(bank)
    url = _url_of(bq.src_uri)
    phrase = _answer_phrase(site, url)
    page.goto(base_url)
    page.keyboard.press("/")  # Material's shortcut to the search box
    box = page.locator("input.md-search__input")
    assert box.evaluate("el => el === document.activeElement")
    box.fill(phrase)
    # Among the results the search shows first (it renders ten, then more on scrolling).
    # The question's own URL: its lesson may share the slug (lessons/part-0/x/ and questions/part-0/x/).
    links = page.locator(f'.md-search-result__list a[href*="{url}"]')
    links.first.wait_for(state="visible")
    hrefs = links.evaluate_all("links => links.map(a => a.href)")
    # A result that matched words links with ?h=<words>; search.highlight marks them on the page it opens.
    marked = [i for i, href in enumerate(hrefs) if parse_qs(urlsplit(href).query).get("h")]
    hit = links.nth(marked[0] if marked else 0)
    hit.scroll_into_view_if_needed()
    shot(page, "search")
    hit.click()
    page.wait_for_url(re.compile(re.escape(base_url + url)))
    expect(heading(page)).to_contain_text(bq.q.title)
    if marked:
        expect(page.locator(".md-content__inner mark").first).to_be_visible()


def test_lesson_to_question_and_back_by_clicking(page, base_url, bank):
    bq = _question_with_lesson(bank)
    lesson = bank.lessons[bq.q.lesson]
    _open_with_instant_navigation(page, base_url + _url_of(lesson.src_uri))
    links = page.locator(f'#interview-links ~ ul a[href$="{bq.slug}/"]')
    assert links.count() >= 1, "the lesson's Interview links do not list the question"
    page.evaluate("window.sameDocument = true")  # instant navigation keeps it; a full load would not
    links.first.click()
    # navigation.tracking writes the section in view into the URL's #fragment, and instant
    # navigation can carry one over: the page, not the fragment, is what must match.
    page.wait_for_url(re.compile(re.escape(base_url + _url_of(bq.src_uri)) + r"(#.*)?$"))
    expect(heading(page)).to_contain_text(bq.q.title)
    page.locator(".bank-meta a", has_text=lesson.meta.title).first.click()
    page.wait_for_url(re.compile(re.escape(base_url + _url_of(lesson.src_uri)) + r"(#.*)?$"))
    expect(heading(page)).to_contain_text(lesson.meta.title)
    assert page.evaluate("window.sameDocument === true"), "the clicks were full page loads, not instant navigation"


def test_practice_mode_hides_reveals_and_remembers(page, base_url, bank):
    bq = _question_with_lesson(bank)
    url = base_url + _url_of(bq.src_uri)
    page.goto(url)
    answers = page.locator(".bank-answer")
    n_answers = answers.count()
    assert n_answers >= 3 + len(bq.q.follow_ups), "answer blocks missing from the question page"
    if page.locator(".md-content__inner pre > code").count():
        copy = page.locator(".md-content__inner pre button[data-md-type=copy], .md-content__inner pre .md-clipboard")
        assert copy.count() >= 1, "code blocks have no copy button"
    assert all(answers.nth(i).is_visible() for i in range(n_answers)), "study mode (the default) shows every answer"

    switch = page.locator(".bank-practice--bar .bank-switch")
    switch.press("Enter")  # from the keyboard
    assert switch.get_attribute("aria-pressed") == "true"
    assert not any(answers.nth(i).is_visible() for i in range(n_answers)), "practice mode hides every answer"
    reveal = page.locator("button.bank-reveal")
    assert reveal.count() == n_answers
    assert {reveal.nth(i).get_attribute("aria-expanded") for i in range(n_answers)} == {"false"}
    shot(page, "question-practice")

    # Reveal the short answer with Enter, the direct answer with Space; the rest stay hidden.
    reveal.nth(0).focus()
    page.keyboard.press("Enter")
    reveal.nth(1).focus()
    page.keyboard.press(" ")
    assert reveal.nth(0).get_attribute("aria-expanded") == "true" and answers.nth(0).is_visible()
    assert reveal.nth(1).get_attribute("aria-expanded") == "true" and answers.nth(1).is_visible()
    assert not answers.nth(2).is_visible()
    shot(page, "question-practice-revealed")

    # Mark it shaky, then leave by instant navigation and come back through the bank index.
    page.locator(".bank-practice--marks .bank-mark--shaky").click()
    assert page.locator(".bank-mark--shaky").get_attribute("aria-pressed") == "true"
    page.evaluate("window.sameDocument = true")  # a full page load would drop it
    page.locator(".md-tabs a", has_text="Question bank").click()
    page.wait_for_url(base_url + "questions/")
    assert page.evaluate("window.sameDocument === true"), "the click was not handled by instant navigation"
    row = page.locator("table tr", has=page.locator(f'a[href$="{bq.slug}/"]')).first
    assert row.locator(".bank-mark-badge").inner_text() == "shaky"
    shaky_round = page.locator("a.bank-round-start", has_text="shaky and missed ones (1)")
    assert shaky_round.count() == 1
    shot(page, "bank-index-marks", full_page=True)
    shaky_round.click()
    page.wait_for_url(url)
    assert page.locator(".bank-round__where").first.inner_text().endswith("question 1 of 1")
    assert not answers.first.is_visible(), "a practice round starts with the answers hidden"

    # A full reload keeps the mode and the mark.
    page.reload()
    assert page.locator(".bank-practice--bar .bank-switch").get_attribute("aria-pressed") == "true"
    assert page.locator(".bank-mark--shaky").get_attribute("aria-pressed") == "true"
    page.locator(".bank-practice__show-all").click()
    assert all(answers.nth(i).is_visible() for i in range(n_answers)), "'Show every answer' shows them all"
    page.locator(".bank-practice--bar .bank-switch").click()
    assert page.locator(".bank-practice__show-all").is_hidden()
    assert all(answers.nth(i).is_visible() for i in range(n_answers)), "study mode shows every answer again"


def test_without_javascript_every_answer_is_readable(browser, base_url, bank):
    ctx = browser.new_context(java_script_enabled=False)
    try:
        page = ctx.new_page()
        bq = _question_with_lesson(bank)
        page.goto(base_url + _url_of(bq.src_uri))
        answers = page.locator(".bank-answer")
        assert answers.count() >= 3
        assert all(answers.nth(i).is_visible() for i in range(answers.count()))
        assert page.locator(".bank-practice").evaluate_all("els => els.every(e => e.offsetHeight === 0)")
    finally:
        ctx.close()


def test_math_and_diagrams_render_from_this_site(page, base_url, site):
    url = _page_with(site, 'class="arithmatex"', 'class="mermaid"')
    page.goto(base_url + url)
    page.wait_for_function("document.querySelectorAll('.arithmatex').length > 0 && "
                           "[...document.querySelectorAll('.arithmatex')].every(e => e.dataset.typeset)")
    assert page.locator(".arithmatex .katex").count() == page.locator(".arithmatex").count()
    # Material swaps each <pre class="mermaid"> for a <div class="mermaid"> holding the rendered SVG.
    page.wait_for_function("document.querySelectorAll('pre.mermaid').length === 0 && "
                           "document.querySelectorAll('div.mermaid').length > 0")
    heights = page.locator("div.mermaid").evaluate_all("els => els.map(e => e.getBoundingClientRect().height)")
    assert min(heights) > 40, f"a diagram rendered empty: heights {heights}"
    page.locator("div.mermaid").first.scroll_into_view_if_needed()
    shot(page, "math-and-diagram")


def _python_budget(model: str, gpu: str, inputs: dict) -> dict:
    from labs import specs
    from labs.kv_sizing import budget

    b = budget(specs.get_model(model), specs.get_gpu(gpu), inputs["max_model_len"],
               gpu_memory_utilization=inputs["gpu_memory_utilization"], kv_cache_dtype=inputs["kv_cache_dtype"],
               tensor_parallel_size=inputs["tensor_parallel_size"], max_num_seqs=inputs["max_num_seqs"])
    return b.to_dict()


def _calculator_cases() -> list[dict]:
    """Every model on every GPU of CALCULATOR_GPUS, at defaults and at one set of changed inputs."""
    from labs import specs

    cases = []
    for model in specs.all_models():
        for gpu in CALCULATOR_GPUS:
            cases.append({"model": model, "gpu": gpu, "max_model_len": 8192, "kv_cache_dtype": "auto",
                          "gpu_memory_utilization": 0.92, "max_num_seqs": None, "tensor_parallel_size": 1})
            cases.append({"model": model, "gpu": gpu, "max_model_len": 32768, "kv_cache_dtype": "fp8",
                          "gpu_memory_utilization": 0.85, "max_num_seqs": 64, "tensor_parallel_size": 8})
    return cases


FILL_FORM = """(form, values) => {
    for (const [name, value] of Object.entries(values)) form.elements[name].value = value;
    form.dispatchEvent(new Event("change", {bubbles: true}));
    return form.closest("[data-kv-calculator]").kvResult;
}"""


def test_calculator_matches_the_python_lab(page, base_url):
    from labs import specs

    page.goto(base_url + "labs/kv-sizing/")
    calc = page.locator("[data-kv-calculator]")
    form = calc.locator("form")
    mismatches = []
    cases = _calculator_cases()
    for case in cases:
        # Through the form: set its fields, fire the event a reader's edit fires, read what the page computed.
        values = {k: "" if v is None else str(v) for k, v in case.items()}
        got = form.evaluate(FILL_FORM, values)
        if case["max_model_len"] > specs.get_model(case["model"]).max_position_embeddings:
            # vLLM refuses a context past the model's positions before it sizes anything.
            if not (got.get("invalid") and "User-specified max_model_len" in (got.get("vllm_error") or "")):
                mismatches.append(f"{case}: past max_position_embeddings, the page computed {got}")
            continue
        try:
            want = _python_budget(case["model"], case["gpu"], case)
        except ValueError as err:  # an input the lab refuses (TP the heads do not divide)
            if not got.get("invalid"):
                mismatches.append(f"{case}: the lab refuses ({err}), the page computed {got}")
            continue
        for field in CALCULATOR_FIELDS:
            if got.get(field) != want[field]:
                mismatches.append(f"{case['model']} on {case['gpu']} {case}: {field} page={got.get(field)} "
                                  f"lab={want[field]}")
        if abs(got["max_concurrency"] - want["max_concurrency"]) > 1e-9 * max(1.0, want["max_concurrency"]):
            mismatches.append(f"{case}: max_concurrency page={got['max_concurrency']} lab={want['max_concurrency']}")
    assert not mismatches, f"{len(mismatches)} mismatch(es) over {len(cases)} cases:\n" + "\n".join(mismatches[:40])

    # What the reader sees, typing into the form: the cards print the lab's numbers.
    form.locator("select[name=model]").select_option("llama-3.1-8b")
    form.locator("select[name=gpu]").select_option("h200")
    form.locator("select[name=kv_cache_dtype]").select_option("auto")
    form.locator("select[name=tensor_parallel_size]").select_option("1")
    form.locator("input[name=max_model_len]").fill("8192")
    form.locator("input[name=gpu_memory_utilization]").fill("0.92")
    form.locator("input[name=max_num_seqs]").fill("")
    want = _python_budget("llama-3.1-8b", "h200", {"max_model_len": 8192, "gpu_memory_utilization": 0.92,
                                                   "kv_cache_dtype": "auto", "tensor_parallel_size": 1,
                                                   "max_num_seqs": None})
    card = calc.locator("[data-result=kv_pool] .kv-calculator__card-value").inner_text()
    assert card == f"{want['kv_pool'] / 2**30:,.2f} GiB"
    tokens = calc.locator("[data-result=kv_cache_tokens] .kv-calculator__card-value").inner_text()
    assert tokens == f"{want['kv_cache_tokens']:,}"
    assert calc.locator(".kv-calculator__formula tbody tr").count() >= 10
    # The whole calculator in one screenshot, below the sticky header.
    page.set_viewport_size({"width": 1280, "height": 1500})
    calc.evaluate("el => window.scrollTo(0, el.getBoundingClientRect().top + window.scrollY - 130)")
    shot(page, "calculator")


def _calculator_text(page) -> str:
    """What the results say, without vLLM's quoted error (vLLM prints its numbers bare)."""
    return page.locator(".kv-calculator__results").evaluate(
        "el => [...el.children].filter(c => !c.matches('pre')).map(c => c.innerText).join(' ')")


@pytest.mark.parametrize("width", [1280, 390])
def test_calculator_caps_the_context_speaks_plainly_and_keeps_its_state(page, base_url, width):
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(base_url + "labs/kv-sizing/")
    # A link at the top of the page, in the first screen, takes the reader to it.
    top = page.locator("a.kv-calculator-link")
    assert top.bounding_box()["y"] < 900, "the calculator link is not in the first screen"
    top.click()
    calc = page.locator("[data-kv-calculator]")
    expect(calc).to_be_in_viewport()
    form = calc.locator("form")

    # Past the model's positions: vLLM's own refusal, and the variable that lifts it.
    form.locator("select[name=model]").select_option("llama-3.1-8b")
    form.locator("input[name=max_model_len]").fill("500000")
    error = page.locator(".kv-calculator__verdict--error")
    expect(error).to_contain_text("131,072")
    expect(error).to_contain_text("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    expect(page.locator(".kv-calculator__vllm-error")).to_have_text(re.compile(
        r"^ValueError: User-specified max_model_len \(500000\) is greater than the derived max_model_len "
        r"\(max_position_embeddings=131072 "))
    form.locator("select[name=model]").select_option("gemma-2-9b")
    form.locator("input[name=max_model_len]").fill("131072")
    expect(error).to_contain_text("8,192 positions")
    assert page.locator(".kv-calculator__cards").count() == 0, "a refused context still shows results"
    shot(page, f"calculator-refused-{width}")

    # One request is "1 request"; every number of four digits or more has separators.
    form.locator("input[name=max_model_len]").fill("8192")
    form.locator("input[name=max_num_seqs]").fill("1")
    verdict = page.locator(".kv-calculator__verdict")
    expect(verdict).to_contain_text("A batch of 1 request at 8,192 tokens fits")
    for model, length in (("gemma-2-9b", "8192"), ("deepseek-v3", "163840"), ("llama-3.1-70b", "131072")):
        form.locator("select[name=model]").select_option(model)
        form.locator("input[name=max_model_len]").fill(length)
        text = _calculator_text(page)
        assert not re.search(r"\b\d+ (requests?|blocks?|tokens?|runs?) ", text.replace("1 request", "")) or \
            not re.search(r"\b1 (requests|blocks|tokens)\b", text), text
        assert not re.search(r"(?<![\d.,])\d{4,}(?![\d,])", text), f"{model}: a number without separators: {text}"
    assert not page.evaluate("document.documentElement.scrollWidth > window.innerWidth"), "the page scrolls sideways"

    # The inputs live in the address: leave, come Back, and they are there.
    form.locator("select[name=model]").select_option("qwen3-8b")
    form.locator("input[name=max_model_len]").fill("32768")
    form.locator("select[name=kv_cache_dtype]").select_option("fp8")
    page.wait_for_function("location.search.includes('max_model_len=32768')")
    assert "model=qwen3-8b" in page.url and "kv_cache_dtype=fp8" in page.url
    page.evaluate(NAVIGATE, base_url + "labs/")
    page.wait_for_url(base_url + "labs/")
    page.go_back()
    page.wait_for_url(re.compile(r"labs/kv-sizing/\?"))
    expect(page.locator("[data-kv-calculator] select[name=model]")).to_have_value("qwen3-8b")
    expect(page.locator("[data-kv-calculator] input[name=max_model_len]")).to_have_value("32768")
    expect(page.locator("[data-kv-calculator] select[name=kv_cache_dtype]")).to_have_value("fp8")
    # A shared link opens with the same inputs.
    page.goto(base_url + "labs/kv-sizing/?model=mistral-7b&max_model_len=16384&gpu=nonsense")
    expect(page.locator("[data-kv-calculator] select[name=model]")).to_have_value("mistral-7b")
    expect(page.locator("[data-kv-calculator] select[name=gpu]")).to_have_value("h200")
    expect(page.locator(".kv-calculator__cards")).to_be_visible()


def test_vram_budget_lesson_links_the_calculator(page, base_url):
    page.goto(base_url + "lessons/part-2/vram-budget-max-concurrency/")
    link = page.locator('article a[href$="labs/kv-sizing/#calculator"]')
    assert link.count() >= 1
    link.first.scroll_into_view_if_needed()
    page.wait_for_timeout(500)  # as a reader does: a click during the first scroll lands where the old page was
    link.first.click()
    page.wait_for_url(re.compile(r"labs/kv-sizing/#calculator$"))
    expect(page.locator("[data-kv-calculator]")).to_be_in_viewport()


def test_calculator_rejects_bad_input_with_a_message(page, base_url):
    page.goto(base_url + "labs/kv-sizing/")
    form = page.locator("[data-kv-calculator] form")
    form.locator("input[name=max_model_len]").fill("0")
    assert "context length" in page.locator(".kv-calculator__verdict--error").inner_text()
    form.locator("input[name=max_model_len]").fill("4096")
    form.locator("select[name=model]").select_option("qwen2.5-7b")  # 28 query heads: TP 8 does not divide them
    form.locator("select[name=tensor_parallel_size]").select_option("8")
    assert "not divisible by tensor parallel size 8" in page.locator(".kv-calculator__verdict--error").inner_text()


@pytest.mark.parametrize("width", [1280, 390])
def test_plots_follow_the_colour_scheme(page, base_url, width):
    """One matplotlib SVG per scheme: Material shows the light one in light mode and the dark one in dark."""
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(base_url + "reference/rooflines/")
    figure = page.locator("figure.plot-figure").first
    light, dark = figure.locator('img[src$="#only-light"]'), figure.locator('img[src$="#only-dark"]')
    assert page.locator("figure.plot-figure").count() >= 5, "one roofline per GPU"
    figure.scroll_into_view_if_needed()
    expect(light).to_be_visible()
    expect(dark).to_be_hidden()
    assert light.evaluate("img => img.complete && img.naturalWidth > 0"), "the light SVG did not load"
    shot(page, f"roofline-light-{width}")
    page.locator("form[data-md-component=palette] label:visible").first.click()
    expect(dark).to_be_visible()
    expect(light).to_be_hidden()
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=dark.element_handle())
    figure.scroll_into_view_if_needed()
    shot(page, f"roofline-dark-{width}")


# The smallest on-screen text of every diagram and plot on the page: a diagram's
# text in its (open) shadow root, scaled from its viewBox to its drawn width; a
# plot's text read from its SVG file, scaled the same way from the <img>'s width.
MEASURE_TEXT = """async () => {
  const out = [];
  const smallest = (root, scale) => {
    let min = Infinity, text = "";
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const el = node.parentElement;
      if (!node.textContent.trim() || !el || el.closest("style, title, desc")) continue;
      const box = el.getBoundingClientRect();
      if (!box.width && !box.height) continue;
      const px = parseFloat(getComputedStyle(el).fontSize) * scale;
      if (px < min) { min = px; text = node.textContent.trim().slice(0, 40); }
    }
    return { min, text };
  };
  document.querySelectorAll("div.mermaid").forEach((host, i) => {
    const svg = host.shadowRoot && host.shadowRoot.querySelector("svg");
    if (!svg) { out.push({ kind: "diagram", i, min: 0, text: "(no open shadow root to measure)" }); return; }
    const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
    out.push({ kind: "diagram", i, ...smallest(svg, scale), scrolls: host.scrollWidth > host.clientWidth + 1,
               cue: !!(host.previousElementSibling && host.previousElementSibling.matches(".scroll-cue--shown")) });
  });
  for (const [i, img] of [...document.querySelectorAll("img.plot-img")].entries()) {
    const width = img.getBoundingClientRect().width;
    if (!width) continue;  // the other scheme's variant
    const doc = new DOMParser().parseFromString(await (await fetch(img.src)).text(), "image/svg+xml");
    const scale = width / Number(doc.documentElement.getAttribute("viewBox").split(/\\s+/)[2]);
    let min = Infinity, text = "";
    doc.querySelectorAll("text").forEach(t => {
      const size = parseFloat((/font-size:\\s*([\\d.]+)px/.exec(t.getAttribute("style") || "") || [])[1]);
      if (size * scale < min) { min = size * scale; text = t.textContent.trim().slice(0, 40); }
    });
    const frame = img.parentElement;
    out.push({ kind: "plot", i, name: img.dataset.plot, min, text, scrolls: frame.scrollWidth > frame.clientWidth + 1,
               cue: !!(frame.previousElementSibling && frame.previousElementSibling.matches(".scroll-cue--shown")) });
  }
  return out;
}"""
MIN_TEXT_PX = 11


def _pages_with_figures(site: Path) -> list[str]:
    pages = []
    for path in sorted(site.rglob("index.html")):
        text = path.read_text(encoding="utf-8")
        if 'class="mermaid"' in text or 'class="plot-img"' in text:
            rel = path.parent.relative_to(site).as_posix()
            pages.append("" if rel == "." else rel + "/")
    return pages


@pytest.mark.parametrize("width", [1280, 390])
def test_no_text_in_a_diagram_or_plot_renders_below_11_px(page, base_url, site, width):
    """Every diagram and plot on every page, as drawn: its smallest text at least 11 px on screen.

    Where a figure would have to shrink further to fit, it keeps its size and
    scrolls, and the page says so above it.
    """
    page.set_viewport_size({"width": width, "height": 900})
    small, unmarked, measured = [], [], 0
    for url in _pages_with_figures(site):
        page.goto(base_url + url)
        page.wait_for_function("document.querySelectorAll('pre.mermaid').length === 0")
        page.wait_for_function("[...document.querySelectorAll('img.plot-img')].every(i => i.complete)")
        page.evaluate("window.scrollCue.checkAll()")
        page.wait_for_timeout(50)
        for fig in page.evaluate(MEASURE_TEXT):
            measured += 1
            if fig["min"] < MIN_TEXT_PX:
                small.append(f"{url} {fig['kind']} {fig.get('name', fig['i'])}: {fig['min']:.1f} px ({fig['text']!r})")
            if fig["scrolls"] and not fig["cue"]:
                unmarked.append(f"{url} {fig['kind']} {fig.get('name', fig['i'])} scrolls with no cue")
        assert not page.evaluate("document.documentElement.scrollWidth > window.innerWidth"), \
            f"{url} scrolls sideways at {width} px"
    assert measured >= 10, f"only {measured} figures measured"
    assert not small, f"text below {MIN_TEXT_PX} px at {width} px wide:\n" + "\n".join(small)
    assert not unmarked, "\n".join(unmarked)
    page.goto(base_url + "lessons/part-0/kv-cache-throughput-ceiling/")
    page.wait_for_function("document.querySelectorAll('pre.mermaid').length === 0")
    page.locator("div.mermaid").first.scroll_into_view_if_needed()
    shot(page, f"diagram-{width}")


def _page_with_widest_equation(site: Path) -> str:
    """The page whose longest display equation (by TeX source) is the longest on the site."""
    best = (0, "")
    for path in sorted(site.rglob("index.html")):
        for tex in re.findall(r'<div class="arithmatex">(.*?)</div>', path.read_text(encoding="utf-8"), re.S):
            rel = path.parent.relative_to(site).as_posix()
            best = max(best, (len(tex), "" if rel == "." else rel + "/"))
    assert best[0], "no display equation on the site"
    return best[1]


@pytest.mark.parametrize("width", [1280, 390])
def test_wide_equations_and_tables_scroll_inside_their_frame_with_a_cue(page, base_url, site, width):
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(base_url + _page_with_widest_equation(site))
    page.wait_for_function("[...document.querySelectorAll('.arithmatex')].every(e => e.dataset.typeset)")
    page.evaluate("window.scrollCue.checkAll()")
    page.wait_for_timeout(50)
    frames = page.locator("div.arithmatex, .md-typeset__scrollwrap").evaluate_all("""els => els.map(e => ({
        over: e.scrollWidth > e.clientWidth + 1, overflowX: getComputedStyle(e).overflowX,
        cue: !!(e.previousElementSibling && e.previousElementSibling.matches('.scroll-cue--shown'))}))""")
    assert frames
    assert all(f["overflowX"] in ("auto", "scroll") for f in frames), frames
    assert all(f["cue"] for f in frames if f["over"]), "a frame scrolls with no cue"
    assert not page.evaluate("document.documentElement.scrollWidth > window.innerWidth"), "the page scrolls sideways"
    if width == 390:
        assert any(f["over"] for f in frames), "nothing wider than a phone here: the cue went untested"
        cue = page.locator(".scroll-cue--shown").first
        cue.scroll_into_view_if_needed()
        expect(cue).to_be_visible()
    shot(page, f"equations-and-tables-{width}")


@pytest.mark.parametrize("width", [1280, 390])
def test_results_table_fits_and_file_names_stay_whole(page, base_url, width):
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(base_url + "labs/paged-attention/")
    compact = page.locator("#measured-results ~ .md-typeset__scrollwrap").first
    compact.scroll_into_view_if_needed()
    headers = compact.locator("th").all_inner_texts()
    assert "Time ÷ SDPA" in headers and "Of copy" in headers and "Floor (µs)" in headers
    if width == 1280:
        assert compact.evaluate("e => e.scrollWidth <= e.clientWidth + 1"), "the compact results table does not fit"
    full = page.locator("details", has_text="Every column").first
    full.locator("summary").click()
    expect(full.locator("table")).to_be_visible()
    assert full.locator("thead th").count() == 11
    shot(page, f"paged-attention-table-{width}")
    broken = []
    for url in ("labs/kv-sizing/", "labs/paged-attention/"):
        page.goto(base_url + url)
        broken += page.locator("article table td code").evaluate_all("""els => els
            .filter(e => !/\\s/.test(e.textContent.trim()) && e.getClientRects().length > 1)
            .map(e => e.textContent)""")
    assert not broken, f"names broken across lines at {width} px: {broken}"


@pytest.mark.parametrize("width", [1280, 390])
def test_section_indexes_are_cards_and_counts_are_honest(page, base_url, bank, width):
    page.set_viewport_size({"width": width, "height": 900})
    for url, at_least in (("labs/", 3), ("reference/", 4), ("lessons/part-0/", 3)):
        page.goto(base_url + url)
        cards = page.locator(".section-cards > ul > li")
        assert cards.count() >= at_least, f"{url}: {cards.count()} cards"
        for i in range(cards.count()):
            card = cards.nth(i)
            expect(card.locator("a").first).to_be_visible()
            assert len(card.inner_text().split()) >= 6, f"{url}: card {i} has no line about its page"
        assert not page.evaluate("document.documentElement.scrollWidth > window.innerWidth"), url
        shot(page, f"index-{url.strip('/').replace('/', '-')}-{width}")
    written = [m for m in bank.modules if bank.lessons_of(m.part)]
    for url in ("", "lessons/", "404.html"):
        page.goto(base_url + url)
        text = page.locator("article").inner_text()
        if len(written) < len(bank.modules):
            assert "Nine modules" not in text and "planned" in text, url
    page.goto(base_url + "labs/")
    page.locator(".section-cards a").first.click()
    expect(heading(page)).to_contain_text("Lab")


@pytest.mark.parametrize("width", [1280, 390])
def test_interview_links_come_before_sources(page, base_url, bank, width):
    page.set_viewport_size({"width": width, "height": 900})
    lesson = next(lesson for lesson in bank.lessons.values() if lesson.meta.sources and bank.links.get(lesson.id))
    page.goto(base_url + _url_of(lesson.src_uri))
    links, sources = page.locator("#interview-links"), page.locator("#sources")
    assert links.bounding_box()["y"] < sources.bounding_box()["y"]
    links.scroll_into_view_if_needed()
    shot(page, f"interview-links-{width}")


SEARCHES = [
    # (query as typed, what each of the first results holds: the name as written, or its other spelling)
    ("--max-num-seqs", ("--max-num-seqs", "max_num_seqs")),
    ("vllm:num_requests_waiting", ("vllm:num_requests_waiting",)),
    ("max_num_batched_tokens", ("max_num_batched_tokens", "--max-num-batched-tokens")),
]


@pytest.mark.parametrize("width", [1280, 390])
def test_search_finds_flags_metrics_and_fields(page, base_url, width):
    page.set_viewport_size({"width": width, "height": 900})
    warnings = []
    page.on("console", lambda msg: msg.type == "warning" and warnings.append(msg.text))
    for query, spellings in SEARCHES:
        page.goto(base_url)
        page.keyboard.press("/")
        box = page.locator("input.md-search__input")
        box.press_sequentially(query, delay=10)  # every prefix is searched as it is typed
        results = page.locator(".md-search-result__list > li > a")
        results.first.wait_for(state="visible")
        page.wait_for_function("q => document.querySelector('.md-search-result__meta').textContent.match(/\\d/)",
                               arg=query)
        hrefs = results.evaluate_all("links => links.slice(0, 3).map(a => a.href.split('?')[0].split('#')[0])")
        for href in hrefs:
            text = html.unescape(page.request.get(href).text())
            assert any(s in text for s in spellings), f"{query!r}: result {href} holds none of {spellings}"
        if query == SEARCHES[0][0]:
            shot(page, f"search-flag-{width}")
    assert not [w for w in warnings if "QueryParseError" in w or "Invalid query" in w], warnings


NAVIGATE = """url => {
    const link = Object.assign(document.createElement("a"), {href: url});
    document.body.appendChild(link);
    link.click();  // Material's instant navigation takes the click, as it takes a reader's
    link.remove();
}"""


def _open_with_instant_navigation(page, url: str) -> None:
    """A full load of url that returns once a click there would be instant navigation.

    Material takes a click only after it has read sitemap.xml, which it fetches once the
    page has loaded: a click before that is a plain full load. On a 2-core CI machine the
    first click of the whole-site session came first twice, and the page it opened had
    lost the session's swap counter. Network idle comes after the sitemap's response."""
    page.goto(url)
    page.wait_for_load_state("networkidle")


def _navigate(page, url: str) -> None:
    """Click through to url and wait until a new document is shown at that address.

    Counted swaps, not the address document$ saw: once in a whole-site session on a 2-core
    CI machine the wait timed out with the page at the new address, which the last swap
    had not recorded. A click that swapped nothing is repeated once."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    arrived = "([url, before]) => window.swaps > before && location.href.split('#')[0] === url"
    before = page.evaluate("window.swaps")
    page.evaluate(NAVIGATE, url)
    try:
        page.wait_for_function(arrived, arg=[url, before])
    except PlaywrightTimeout:
        # A click that brought no swap is clicked once more, as a reader would; a page that
        # breaks instant navigation fails that too, and a swap to the wrong address fails at once.
        swaps = page.evaluate("window.swaps")
        assert swaps is not None, f"the click on {url} was a full page load, not instant navigation"
        if swaps > before:
            raise
        page.evaluate(NAVIGATE, url)
        page.wait_for_function(arrived, arg=[url, before])


def test_every_page_loads_with_no_foreign_request_and_no_console_error(page, base_url, site, recorder):
    """The whole site in one reading session: nothing leaves 127.0.0.1, nothing logs an error.

    The first page is a full load; every other page is reached by instant
    navigation, the way a reader moves through the site, so each page's scripts
    (math, diagrams, practice mode, calculator) run on swapped-in content. The
    404 page ends the session with a second full load.
    """
    urls = [base_url + ("" if rel == "." else rel + "/")
            for rel in sorted(path.parent.relative_to(site).as_posix() for path in site.rglob("index.html"))]
    assert len(urls) > 10
    _open_with_instant_navigation(page, urls[0])
    # The page, not the #fragment: navigation.tracking writes the section in view into the
    # URL, and instant navigation can carry it to the next page (as in the lesson test above),
    # which made an exact match time out now and then.
    page.evaluate("window.swaps = 0; document$.subscribe(() => { window.swaps += 1 })")
    for url in urls[1:]:
        _navigate(page, url)
        if page.locator("pre.mermaid").count():
            page.wait_for_function("document.querySelectorAll('pre.mermaid').length === 0")
    page.goto(base_url + "404.html")  # what GitHub Pages serves for an unknown address
    expect(page.locator(".md-content__inner h1")).to_have_text("Page not found")
    local = [u for u in recorder.requests if urlsplit(u).hostname == HOST]
    assert any("/assets/vendor/katex/" in u for u in local), "KaTeX was not loaded from this site"
    assert any("/assets/vendor/mermaid/" in u for u in local), "Mermaid was not loaded from this site"
