"""Every `python -m labs.…` command line, fed the bad values a tester would try.

The entry points are found, not listed: a package with `__main__.py`, or a
module with `def main(argv…)` under an `if __name__ == "__main__":` guard. A CLI
added tomorrow is covered the day it lands. Each one's argparse parser is read
(sub-commands included) and every option that takes a value gets the standard
bad values for its kind:

* numbers: non-numeric, empty, NaN, ±inf, a fraction for a whole number, 10**30,
  and, for a `labs.cli` type that states its bounds, just outside each bound
  (the bounds themselves must be accepted);
* names from a list: an unknown one, an empty one;
* paths (a path type, or an option named like one): missing, a folder where a
  file belongs, a file where a folder belongs, a folder under a file, an
  unwritable place, an empty string.

Each bad value goes through the CLI's `main(argv)` in-process and must exit 2
with one line on stderr that names the option, and no traceback. A type that
accepts NaN, infinity or 10**30 fails here outright: a number with no bound is
how a run becomes unbounded. Values only the option's meaning can judge (is -1
a valid seed?) are left to each lab's own tests. Runs happen with CUDA hidden,
under a time limit and a memory cap, so a bad value that slipped through cannot
start a GPU run or a large one; a few subprocess cases at the end check the real
`python -m` path.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from cli_helpers import GUARD, LABS, TIME_LIMIT_S, TimedOut, load_main, one_line, run_main
from conftest import ROOT

MAIN = re.compile(r"^def main\(argv", re.M)
PATH_KINDS = ("file", "folder", "output-folder", "output-file")
# Names that say an option is a path, whatever its type.
PATHY = re.compile(r"(^|_)(out|dir|path|file|config|snapshot|log|junit|json)($|_)|^(DIR|PATH|FILE)$", re.I)
HUGE = "1" + "0" * 30


def entry_points() -> list[str]:
    found, delegates = [], set()
    for path in sorted(LABS.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        text = path.read_text(encoding="utf-8")
        if path.name == "__main__.py":
            found.append(".".join(parts[:-1]))
            delegates |= set(re.findall(r"^from ([\w.]+) import main\b", text, re.M))
        elif path.name != "__init__.py" and GUARD.search(text) and MAIN.search(text):
            found.append(".".join(parts))
    return [m for m in found if m not in delegates]  # `python -m pkg` and its cli module are one CLI


class _Captured(Exception):
    pass


def capture_parser(main) -> argparse.ArgumentParser | None:
    """The parser `main` builds, caught at its first parse call (nothing else runs)."""
    seen = []

    def grab(self, args=None, namespace=None):
        seen.append(self)
        raise _Captured

    with mock.patch.object(argparse.ArgumentParser, "parse_known_args", grab), \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main([])
        except _Captured:
            pass
    return seen[0] if seen else None


def leaves(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(sub-command words, parser) for every parser that takes options, sub-commands walked."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    done = set()
    for name, sub in subs[0].choices.items():
        if id(sub) not in done:  # aliases share a parser
            done.add(id(sub))
            yield from leaves(sub, prefix + (name,))


# ---------------------------------------------------------------------------
# The standard bad values
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    cli: str
    words: tuple[str, ...]  # sub-command words
    option: str
    value: str  # a label; path values are made in a tmp folder at run time
    expect: str  # "reject": exit 2 naming the option; "accept": the type takes it; "loose": the type should not
    kind: str = ""

    @property
    def id(self) -> str:
        return f"{self.cli} {' '.join(self.words)} {self.option}={self.value}".replace("  ", " ")


# Bad for any number, whatever the option means.
ALWAYS_BAD = ("abc", "", "nan", "-nan", "inf", "-inf", "1e400", HUGE)
# Values a CLI documents as meaningful, which ALWAYS_BAD would otherwise flag.
DOCUMENTED = {
    ("labs.serving_sim", ("knobs",), "--rate", "inf"): "an infinite rate sends every request at t = 0",
    ("labs.serving_sim", ("knobs",), "--rate", "1e400"): "1e400 reads as inf",
}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e18 else repr(float(x))


def int_values(parse) -> list[tuple[str, str]]:
    lo, hi = parse.bounds
    out = [(v, "reject") for v in ("abc", "", "1.5", "nan", "inf", "-inf", "1e3", "0x10", HUGE)]
    if lo is not None:
        out += [(str(lo - 1), "reject"), (str(lo), "accept")]
        if lo > 0:
            out.append(("-1", "reject"))
    if hi is not None:
        out += [(str(hi + 1), "reject"), (str(hi), "accept")]
    return out


def float_values(parse) -> list[tuple[str, str]]:
    (lo, hi), (lo_open, hi_open) = parse.bounds, parse.open_ends
    out = [(v, "reject") for v in ("abc", "", "nan", "-nan", "inf", "-inf", "1e400")]
    if lo is not None:
        out.append((_num(lo - max(1.0, abs(lo))), "reject"))
        out.append((_num(lo), "reject" if lo_open else "accept"))
    if hi is not None:
        out.append((_num(hi + max(1.0, abs(hi))), "reject"))
        out.append((_num(hi), "reject" if hi_open else "accept"))
    return out


def list_values(parse) -> list[tuple[str, str]]:
    out = [(v, "reject") for v in ("", ",", "abc", "1,abc", "nan", "1,,2")]
    out.append((",".join(["1"] * (parse.max_items + 1)), "reject"))
    item_bad = [v for v, e in (int_values if parse.item.kind == "int" else float_values)(parse.item)
                if e == "reject" and v not in ("", "abc") and "," not in v]
    out += [(f"1,{v}" if v and not v.startswith("-") else v, "reject") for v in item_bad[-2:]]
    return out


PATH_VALUES = {
    "file": ["missing", "a-folder", "empty"],
    "folder": ["missing", "a-file", "empty"],
    "output-folder": ["a-file", "under-a-file", "unwritable", "empty"],
    "output-file": ["a-folder", "under-a-file", "unwritable", "empty"],
    "path": ["missing", "empty"],  # named like a path, with a type the harness does not know
}
OUTPUT_NAMES = re.compile(r"^(out|output|out_dir|result_dir|results|log_dir|junit)$")


def _refuses(parse, value: str) -> bool:
    try:
        parse(value)
    except (argparse.ArgumentTypeError, ValueError, TypeError, OverflowError):
        return True
    return False


def action_cases(cli: str, words: tuple[str, ...], action: argparse.Action) -> list[Case]:
    option = action.option_strings[-1]
    kind = getattr(action.type, "kind", None)
    pathy = any(PATHY.search(w) for w in f"{action.dest} {action.metavar or ''}".split())

    def make(pairs, k=kind or ""):
        return [Case(cli, words, option, v, e, k) for v, e in pairs]

    if kind == "int":
        return make(int_values(action.type))
    if kind == "float":
        return make(float_values(action.type))
    if kind in ("int-list", "float-list"):
        return make(list_values(action.type))
    if kind in PATH_KINDS:
        return make((v, "reject") for v in PATH_VALUES[kind])
    if kind == "choice" or action.choices:
        return make([("no-such-name", "reject"), ("", "reject")], "choice")
    if action.type in (None, str) or action.type is Path:
        if not pathy:
            return []  # free text (a prompt, a model name): its meaning is the CLI's to check
        guess = "output-folder" if OUTPUT_NAMES.match(action.dest) else "path"
        return make(((v, "reject") for v in PATH_VALUES[guess]), guess)
    # A number type the harness does not know (plain int/float, or the CLI's own): ask it.
    out = []
    for value in ALWAYS_BAD:
        if _refuses(action.type, value):
            out.append((value, "reject"))
        elif (cli, words, option, value) not in DOCUMENTED:
            out.append((value, "loose"))
    return make(out, "number")


PARSERS: dict[str, argparse.ArgumentParser] = {}


def collect() -> tuple[list[Case], list[tuple[str, str]]]:
    cases, skipped = [], []
    for cli in entry_points():
        main, why = load_main(cli)
        if main is None:
            skipped.append((cli, why))
            continue
        parser = capture_parser(main)
        if parser is None:
            skipped.append((cli, "builds no argparse parser"))
            continue
        PARSERS[cli] = parser
        for words, leaf in leaves(parser):
            for action in leaf._actions:
                if action.option_strings and action.nargs != 0 and action.help != argparse.SUPPRESS:
                    cases += action_cases(cli, words, action)
    return cases, skipped


CASES, SKIPPED = collect()


# ---------------------------------------------------------------------------
# Running one case
# ---------------------------------------------------------------------------


def path_value(label: str, tmp: Path) -> str:
    (tmp / "a-file").write_text("x")
    (tmp / "a-folder").mkdir(exist_ok=True)
    return {
        "missing": str(tmp / "no-such-thing.json"),
        "a-folder": str(tmp / "a-folder"),
        "a-file": str(tmp / "a-file"),
        "under-a-file": str(tmp / "a-file" / "sub"),
        "unwritable": "/proc/labs-cli-probe/out",  # /proc refuses new entries, even to root
        "empty": "",
    }[label]


def _parse_only(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[int | None, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            return exc.code, err.getvalue()
    return None, ""


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_value(case: Case, tmp_path):
    if case.expect == "loose":
        pytest.fail(f"{case.cli} {' '.join(case.words)} {case.option} accepts {case.value!r}: give it a labs.cli "
                    "type (bounded_int, finite_float, ...) that states what is allowed")
    paths = {v for vs in PATH_VALUES.values() for v in vs}
    value = path_value(case.value, tmp_path) if case.kind in PATH_VALUES and case.value in paths else case.value
    if case.expect == "accept":
        action = next(a for words, leaf in leaves(PARSERS[case.cli]) if words == case.words
                      for a in leaf._actions if case.option in a.option_strings)
        action.type(value)  # a bound the type states is one it takes
        return
    argv = [*case.words, f"{case.option}={value}"]  # "=" so that "-1" or "" is read as the value
    try:
        # The parser main() builds, already built: most bad values stop there, as they would in main().
        code, err = _parse_only(PARSERS[case.cli], argv)
        if code is None:  # the parser took it: main() must refuse it after parsing
            code, _, err = run_main(case.cli, argv)
    except TimedOut:
        pytest.fail(f"python -m {case.cli} {' '.join(argv)} ran past {TIME_LIMIT_S} s: the run is not bounded")
    except Exception as exc:  # noqa: BLE001  (a traceback is the failure being tested for)
        pytest.fail(f"python -m {case.cli} {' '.join(argv)} raised {type(exc).__name__}: {exc}")
    lines = one_line(err)
    assert "Traceback" not in err
    assert code == 2, f"exit {code}, stderr: {err!r}"
    assert len(lines) == 1, f"expected one line on stderr, got {lines}"
    assert case.option in lines[0], f"the message does not name {case.option}: {lines[0]}"


def test_every_entry_point_was_found_and_read():
    found = entry_points()
    for cli in ("labs.kv_sizing", "labs.kv_sizing.check", "labs.oom", "labs.paged_attention.bench",
                "labs.number_formats", "labs.run_all"):
        assert cli in found
    covered = {c.cli for c in CASES}
    unimportable = {cli for cli, why in SKIPPED if "cannot be imported here" in why}  # torch absent, say
    missing = [cli for cli in found if cli not in covered | unimportable]
    assert not missing, f"no options read from {missing} ({dict(SKIPPED)})"


@pytest.mark.parametrize("cli", entry_points())
def test_every_parser_gives_one_line_errors(cli):
    main, why = load_main(cli)
    if main is None:
        pytest.skip(why)
    code, _, err = run_main(cli, ["--no-such-option"])
    assert code == 2 and len(one_line(err)) == 1, err


# ---------------------------------------------------------------------------
# A few cases through a real `python -m`, and ones that need two arguments
# ---------------------------------------------------------------------------


def _python_m(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args, rc, needle", [
    (("labs.kv_sizing", "--block-size", "0"), 2, "argument --block-size: expected a multiple of 16"),
    (("labs.kv_sizing", "--activation-gib", "nan"), 2, "argument --activation-gib: expected a finite number"),
    (("labs.number_formats", "--values", "-1e-9", "2"), 0, ""),
    (("labs.run_all", "--out", "/proc/labs-cli-probe"), 2, "argument --out: /proc/labs-cli-probe: cannot write"),
    (("labs.run_all", "--timeout", "inf"), 2, "argument --timeout: expected a finite number"),
])
def test_python_m(args, rc, needle):
    proc = _python_m(*args)
    assert proc.returncode == rc, proc.stderr
    assert "Traceback" not in proc.stderr
    if rc == 2:
        assert len(one_line(proc.stderr)) == 1 and needle in proc.stderr


@pytest.mark.parametrize("argv, needle", [
    (["--model", "llama-3.1-8b", "--max-model-len", "131073"], "at most 131,072 tokens"),
    (["--model", "qwen3-4b", "--max-model-len", HUGE], "--max-model-len"),
])
def test_beyond_max_position_embeddings(argv, needle):
    code, _, err = run_main("labs.kv_sizing", argv)
    assert code == 2 and len(one_line(err)) == 1 and needle in err
