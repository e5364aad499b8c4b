"""No page does arithmetic.

Pages render numbers from the cost model (labs/roofline.py through macros.py), recorded
lab results and the worked examples of labs/worked; they do not re-derive them in Jinja.
This test finds the template expressions in docs/**/*.md and questions/**/*.yaml that do
arithmetic. An expression counts if it applies + - * / // % ** outside quoted strings (a
minus sign that starts a number literal is not an operator), or calls a generic arithmetic
macro or filter (mul, add, ratio, sum...), so renaming cannot hide it. Expressions are
`{{ ... }}` and every `{% ... %}` tag (set, if, for...), one line or several. Formatting
filters (`| gib`, `| ms(1)`) change a number's unit, not the number, and do not count.

The count was 679 at the start of round 2 and reached 0 when the last pages moved their
worked examples into labs/worked; a page that needs a new figure gives it a field there.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


EXPRESSION = re.compile(r"\{\{(.*?)\}\}|\{%-?(.*?)-?%\}", re.S)
COMMENT = re.compile(r"\{#.*?#\}", re.S)
STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", re.S)
TOKEN = re.compile(
    r"(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_]\w*)"
    r"|(?P<op>\*\*|//|[-+*/%])"
    r"|(?P<close>[)\]])"
    r"|(?P<other>\S)"
)
KEYWORDS = {"if", "else", "elif", "and", "or", "not", "in", "is", "for", "set", "endfor", "endif", "endset",
            "macro", "endmacro", "with", "endwith", "import", "from", "as", "filter", "endfilter", "recursive"}
GENERIC = {"add", "sub", "subtract", "mul", "multiply", "div", "divide", "ratio", "times", "product", "plus",
           "minus", "sum", "diff", "difference", "quotient", "scale", "scaled", "percent_of"}


def is_arithmetic(expression: str) -> bool:
    """True when a template expression (without its delimiters) does arithmetic."""
    code = STRING.sub("''", expression)
    prev_operand = False
    prev = None
    for m in TOKEN.finditer(code):
        kind, text = m.lastgroup, m.group()
        if kind == "op":
            if prev_operand:
                return True
            if text not in "+-":  # a leading * or / cannot be unary: `**kwargs` is not Jinja
                return True
            prev_operand = False
        elif kind == "name":
            if text in GENERIC:
                after = code[m.end():].lstrip()
                if after.startswith("(") or prev == "|":
                    return True
            prev_operand = text not in KEYWORDS
        elif kind in ("num", "close"):
            prev_operand = True
        else:
            prev_operand = False
        prev = text
    return False


def expressions(text: str):
    """(line, expression) for every template expression in a page."""
    text = COMMENT.sub(lambda m: "\n" * m.group().count("\n"), text)
    for m in EXPRESSION.finditer(text):
        body = m.group(1) if m.group(1) is not None else m.group(2)
        yield text.count("\n", 0, m.start()) + 1, body


def page_files(root: Path = ROOT) -> list[Path]:
    return sorted([*root.glob("docs/**/*.md"), *root.glob("questions/**/*.yaml")])


def offenders(root: Path = ROOT) -> list[str]:
    rows = []
    for path in page_files(root):
        for line, body in expressions(path.read_text(encoding="utf-8")):
            if is_arithmetic(body):
                rows.append(f"{path.relative_to(root)}:{line}: {' '.join(body.split())[:100]}")
    return rows


@pytest.mark.parametrize("expression,counts", [
    (" a * b ", True),
    (" (x / 1e9) | num(1) ", True),
    (" n - 1 ", True),
    (" 2 ** 10 ", True),
    (" a // b ", True),
    (" a % 3 ", True),
    (" cost('llama-3.1-8b', 'h200').decode(1, 1024).floor_s | ms ", False),  # a hyphen inside a string
    (' model("qwen2.5-7b").n_layers ', False),
    (" 1e-3 ", False),  # an exponent, not a subtraction
    (" [-1, 2] ", False),  # unary minus on a literal
    (" f(x, -2) ", False),
    (" set total = pool.kv_pool ", False),
    (" x | mul(3) ", True),  # generic arithmetic filters count
    (" ratio(a, b) | num(2) ", True),
    (" values | sum ", True),
    (" 'a*b' ~ label ", False),  # concatenation, operator inside a string
    (" set per = d.kv_pool(8192)\n      .num_blocks * 16 ", True),  # spread over lines
    (" if step.bound == 'compute' ", False),
    (" for B, L in [(1, 1024), (64, 8192)] ", False),
    (" if a / b > 2 ", True),
    (" x | round(0, 'floor') ", False),
    (" -x ", False),
])
def test_counting_rule(expression, counts):
    assert is_arithmetic(expression) is counts


def test_expressions_span_lines_and_skip_comments():
    text = "{# {{ a * b }} #}\nA {{ a\n * b }} and {% set c = d %}{{ e }}\n"
    found = list(expressions(text))
    assert [(line, is_arithmetic(body)) for line, body in found] == [(2, True), (3, False), (3, False)]


def test_no_page_computes_a_number():
    rows = offenders()
    assert not rows, (
        f"{len(rows)} arithmetic expressions in pages: give the figure a field in a worked example "
        "(labs/worked) or the lab's report.py, or use a cost-model macro (macros.py `cost`), and quote it.\n"
        + "\n".join(rows))
