"""labs/cli.py: the argument types every lab CLI uses, and its one-line parser."""

from __future__ import annotations

import argparse
import contextlib
import io
import math

import pytest

from labs import cli


def _refused(parse, text: str) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as exc:
        parse(text)
    return str(exc.value)


def test_numbers_say_what_is_allowed():
    assert cli.positive_int("7") == 7
    assert "expected a whole number >= 1, got '0'" in _refused(cli.positive_int, "0")
    assert "from 1 to 1,000" in _refused(cli.count(1000), "1001")
    assert "a multiple of 16 from 16 to 4,096" in _refused(cli.bounded_int(16, 4096, multiple_of=16), "24")
    assert "a power of 2 from 1 to 32" in _refused(cli.power_of_two(1, 32), "3")
    assert cli.fraction("1") == 1.0
    for bad in ("0", "nan", "inf", "1.01", "x"):
        assert "(0, 1]" in _refused(cli.fraction, bad)
    assert cli.finite_float()("-1e-9") == -1e-9
    assert "finite" in _refused(cli.finite_float(), "1e400")


def test_lists_check_every_item_and_their_count():
    ints = cli.number_list(cli.bounded_int(1, 10), max_items=3)
    assert ints("1,2,3") == (1, 2, 3)
    assert "in '1,99'" in _refused(ints, "1,99")
    assert "at most 3 values" in _refused(ints, "1,1,1,1")
    assert "comma-separated" in _refused(ints, "1,,2")
    floats = cli.number_list(cli.finite_float(0, 1))
    assert math.isclose(floats("0.5,1")[0], 0.5)
    assert "got 'nan'" in _refused(floats, "0.5,nan")


def test_paths(tmp_path):
    (tmp_path / "f").write_text("x")
    assert cli.existing_file(str(tmp_path / "f")).name == "f"
    assert "is a folder, not a file" in _refused(cli.existing_file, str(tmp_path))
    assert "no such file" in _refused(cli.existing_file, str(tmp_path / "none"))
    assert "is a file, not a folder" in _refused(cli.existing_dir, str(tmp_path / "f"))
    assert cli.output_dir(str(tmp_path / "new" / "deeper")) == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists(), "checking a folder creates nothing"
    assert list(tmp_path.iterdir()) == [tmp_path / "f"], "the write probe leaves nothing behind"
    assert "cannot write there: " in _refused(cli.output_dir, str(tmp_path / "f" / "sub"))
    assert "cannot write there" in _refused(cli.output_dir, "/proc/labs-cli-probe")
    assert "is a folder, not a file" in _refused(cli.output_file, str(tmp_path))
    assert "empty string" in _refused(cli.output_dir, "")


def test_parser_gives_one_line_and_reads_negative_numbers():
    p = cli.Parser(prog="prog")
    p.add_argument("--values", type=cli.finite_float(), nargs="+")
    p.add_argument("--n", type=cli.positive_int)
    assert p.parse_args(["--values", "-1e-9", "-2"]).values == [-1e-9, -2.0]  # values, not unknown flags
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
        p.parse_args(["--n", "0"])
    assert exc.value.code == 2
    assert err.getvalue().splitlines() == [
        "prog: error: argument --n: expected a whole number >= 1, got '0' (--help lists the options)"]
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit):
        p.parse_args(["--values", "-inf"])
