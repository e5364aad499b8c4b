"""The paged-attention lab's page macros: the numbers they render are the recorded ones.

No torch: labs/paged_attention/report.py must run in the site-only environment. The
table is parsed back into numbers and compared with the JSON it was rendered from,
so a column that shows the wrong field, or a rounding that changes a value, fails.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from labs import recorded
from labs.paged_attention import bench, report

RECORDED_FILE = recorded.load_results(bench.RESULTS_PATH)


def _as_entries(results: recorded.Results) -> dict:
    """GPU label -> {gpu, rows, **run}: the recorded file in the shape the assertions below read."""
    return {label: {"gpu": label, **m.rows[0]["run"], "rows": m.rows, "table": m.derived.get("table")}
            for label, m in results.machines.items()}


RECORDED = _as_entries(RECORDED_FILE)


def _row(shape: str, batch: int, ctx: int, hq: int, hkv: int, time_us: float, copy_tb_s: float) -> dict:
    kv_bytes = 2 * batch * ctx * hkv * 128 * 2
    tb_s = kv_bytes / time_us / 1e6
    return {
        "shape": shape, "batch": batch, "context_len": ctx, "q_heads": hq, "kv_heads": hkv, "head_dim": 128,
        "block_size": 16, "dtype": "bfloat16", "num_splits": 3, "tile_n": 64, "num_warps": 4, "num_stages": 3,
        "kv_bytes": kv_bytes, "floor_us": round(kv_bytes / copy_tb_s / 1e6, 2), "time_us": time_us,
        "rerun_spread": 0.001, "tb_s": round(tb_s, 3), "copy_fraction": round(tb_s / copy_tb_s, 3),
        "sdpa_time_us": round(time_us * 0.97, 2), "ratio_to_sdpa": round(1 / 0.97, 3),
        "sdpa_us_by_backend": {"cudnn": round(time_us * 0.97, 2)}, "rel_err": 0.002, "sdpa_rel_err": 0.002,
    }


def _entry(gpu: str, date: str, copy_tb_s: float, backend: str, rows: list[dict]) -> dict:
    return {
        "gpu": gpu, "compute_capability": "9.0", "sm_count": 132, "driver": "999.1", "torch": "9.9.9",
        "cuda": "99.0", "triton": "8.8.8", "date": date, "copy_tb_s": copy_tb_s, "copy_graph_tb_s": 1.0,
        "sdpa_backend": backend, "sdpa_kernels": [], "max_memory_reserved_gib": 1.0,
        "table": bench.format_table(rows), "rows": rows,
    }


TWO_GPUS = {
    "GPU Alpha": _entry("GPU Alpha", "2030-01-02", 3.0, "cudnn",
                        [_row("b8-l1k", 8, 1024, 32, 8, 41.37, 3.0), _row("b2-l9k", 2, 9000, 16, 4, 77.7, 3.0)]),
    "GPU Beta": _entry("GPU Beta", "2030-03-04", 7.5, "flash", [_row("b8-l1k", 8, 1024, 32, 8, 12.34, 7.5)]),
}


@pytest.fixture
def results(tmp_path, monkeypatch):
    """Point the macros at a results file of the test's choosing; returns a writer."""
    path = tmp_path / "paged_attention.json"
    monkeypatch.setattr(report, "RESULTS_PATH", path)

    def write(gpus: dict | None = None, text: str | None = None) -> Path:
        if text is not None:
            path.write_text(text)
        else:
            for entry in gpus.values():  # one --record run per GPU
                bench.record(entry, path)
        return path

    return write


def _table_rows(markdown: str, full: bool = True) -> list[list[str]]:
    """The data rows of the full tables (every column, inside the collapsible block), or of the compact ones."""
    rows = []
    for line in markdown.splitlines():
        if line.lstrip().startswith("| `") and line.startswith("    ") == full:
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def _num(cell: str) -> float:
    return float(cell.replace(",", ""))


def _assert_table_matches(markdown: str, gpus: dict) -> None:
    rows = _table_rows(markdown)
    expected = [(e, r) for e in gpus.values() for r in e["rows"]]
    # The compact table shows the columns the page's text reads, the same numbers.
    compact = _table_rows(markdown, full=False)
    assert [c[0] for c in compact] == [f"`{r['shape']}`" for _, r in expected]
    for cells, (_, r) in zip(compact, expected):
        assert len(cells) == 6
        assert _num(cells[1]) == pytest.approx(r["time_us"], abs=0.0501)  # 498.75 shows as 498.8
        assert _num(cells[3]) == r["copy_fraction"] and _num(cells[5]) == r["ratio_to_sdpa"]
    assert len(rows) == len(expected), f"{len(rows)} table rows for {len(expected)} recorded rows"
    for cells, (e, r) in zip(rows, expected):
        shape, dims, splits, t, floor, mib, tbs, frac, sdpa, ratio, backend = cells
        assert shape == f"`{r['shape']}`"
        assert [int(x) for x in re.findall(r"\d+", dims)] == [r["batch"], r["context_len"], r["q_heads"],
                                                              r["kv_heads"]]
        assert int(splits) == r["num_splits"]
        assert _num(t) == pytest.approx(r["time_us"], abs=0.0501)
        assert _num(floor) == pytest.approx(r["floor_us"], abs=0.0501)
        assert _num(mib) == pytest.approx(r["kv_bytes"] / 2**20, abs=0.5)
        assert _num(tbs) == pytest.approx(r["tb_s"], abs=0.0051)  # 2 decimals of a 3-decimal value
        assert _num(frac) == r["copy_fraction"]
        assert _num(sdpa) == pytest.approx(r["sdpa_time_us"], abs=0.0501)
        assert _num(ratio) == r["ratio_to_sdpa"]
        assert backend == (r["run"]["sdpa_backend"] if "run" in r else e["sdpa_backend"])


def test_table_of_the_recorded_file_shows_its_numbers():
    for label, e in RECORDED.items():
        md = report.paged_attention_results_table(gpu=label)
        _assert_table_matches(md, {label: {**e, "rows": bench.table_rows(e["rows"], "shapes")}})
        for value in (e["gpu"], e["driver"], e["torch"], e["triton"], e["date"], f"{e['copy_tb_s']:.2f} TB/s"):
            assert value in md


def test_each_gpu_is_a_table_with_its_own_environment(results):
    results(TWO_GPUS)
    alpha = report.paged_attention_results_table(gpu="GPU Alpha")
    beta = report.paged_attention_results_table(gpu="GPU Beta")
    _assert_table_matches(alpha, {"GPU Alpha": TWO_GPUS["GPU Alpha"]})
    _assert_table_matches(beta, {"GPU Beta": TWO_GPUS["GPU Beta"]})
    assert "**GPU Alpha**" in alpha and "2030-01-02" in alpha and "2030-03-04" not in alpha
    assert "2030-03-04" in beta and "7.50 TB/s" in beta and "| flash |" in beta
    assert alpha.count("| Shape |") == 2 and beta.count("| Shape |") == 2  # a compact and a full table each


def test_a_second_gpu_recorded_keeps_the_first_and_every_page_macro_still_renders(tmp_path, monkeypatch):
    """Recording another GPU used to break the build: the headline picked no GPU. Each macro names one now."""
    path = tmp_path / "paged_attention.json"
    path.write_text(bench.RESULTS_PATH.read_text(encoding="utf-8"))
    monkeypatch.setattr(report, "RESULTS_PATH", path)
    print(bench.record(TWO_GPUS["GPU Beta"], path))
    after = recorded.load_results(path)
    assert sorted(after.machines) == sorted([*RECORDED, "GPU Beta"])
    for label, e in RECORDED.items():
        assert after.machines[label].rows == e["rows"]
        assert f"{e['rows'][1]['time_us']:,.1f} µs" in report.paged_attention_headline(e["rows"][1]["shape"], gpu=label)
    assert "GPU Beta" in report.paged_attention_headline("b8-l1k", gpu="GPU Beta")


def test_gpu_argument_picks_one_table(results):
    results(TWO_GPUS)
    md = report.paged_attention_results_table(gpu="beta")
    _assert_table_matches(md, {"GPU Beta": TWO_GPUS["GPU Beta"]})
    with pytest.raises(report.ResultsError, match="matches"):
        report.paged_attention_results_table(gpu="GPU")  # two GPUs match: ambiguous
    with pytest.raises(report.ResultsError, match="GPU Alpha"):
        report.paged_attention_results_table(gpu="gamma")


def test_without_results_the_page_says_how_to_record_them(results):
    for md in (report.paged_attention_results_table("Alpha"), report.paged_attention_env("Alpha"),
               report.paged_attention_headline("b8-l1k", "Alpha")):
        assert md.startswith("No paged-attention results are recorded yet (the page shows Alpha).")
        assert report.RECORD_COMMAND in md
        assert "|" not in md
    assert report.paged_attention_recorded("Alpha") is False
    with pytest.raises(report.ResultsError, match="paged_attention_recorded"):
        report.paged_attention_row("b32-l4k", "Alpha")


def test_a_gpu_the_file_does_not_hold_is_an_error_naming_those_it_does(results):
    results({"GPU Beta": TWO_GPUS["GPU Beta"]})
    assert report.paged_attention_recorded("Alpha") is False  # for a page's {% if %}
    for call in (lambda: report.paged_attention_results_table("Alpha"), lambda: report.paged_attention_env("Alpha"),
                 lambda: report.paged_attention_headline("b8-l1k", "Alpha")):
        with pytest.raises(report.ResultsError, match=r"'Alpha'.*recorded: \['GPU Beta'\]"):
            call()


@pytest.mark.parametrize("text", ["", '{"schema": 2, "lab": "paged_attention", "key": ["sha', "{\n  \"schema\": 2,\n  oops"])
def test_a_truncated_file_names_the_file_and_position(results, text):
    results(text=text)
    with pytest.raises(recorded.RecordedError, match=r"paged_attention\.json:\d+:\d+: not valid JSON"):
        report.paged_attention_results_table("Alpha")


def test_an_old_layout_fails_loudly(results):
    results(text=json.dumps({"schema": 1, "gpus": {}}))
    with pytest.raises(recorded.RecordedError, match="\"schema\": 2 .*found schema 1"):
        report.paged_attention_results_table("Alpha")


def test_headline_and_row_quote_the_recorded_row(results):
    results(TWO_GPUS)
    r = TWO_GPUS["GPU Alpha"]["rows"][1]
    assert report.paged_attention_row("b2-l9k", gpu="GPU Alpha") is not None
    assert report.paged_attention_row("b2-l9k", gpu="GPU Alpha")["time_us"] == r["time_us"]
    line = report.paged_attention_headline("b2-l9k", gpu="GPU Alpha")
    assert "GPU Alpha" in line and "2030-01-02" in line
    assert f"{r['time_us']:.1f} µs" in line and f"{r['tb_s']:.2f} TB/s" in line
    assert "(2, 9000, 16, 4)" in line
    with pytest.raises(report.ResultsError, match="b8-l1k"):
        report.paged_attention_row("b1-l4k", gpu="GPU Alpha")
    with pytest.raises(report.ResultsError, match="matches 2"):
        report.paged_attention_row("b8-l1k", gpu="GPU")


def test_recorded_transcript_is_what_format_table_prints():
    """The `table` string a question shows as the command's output is derived from the rows."""
    assert RECORDED
    for e in RECORDED.values():
        tables = {key: bench.table_rows(e["rows"], t) for t, key in bench.ENTRY_TABLES.items()}
        assert e["table"] == bench.format_all(tables)
        shapes = tables["rows"]
        assert e["table"].splitlines()[0] == bench.TABLE_HEADER
        for line, r in zip(e["table"].splitlines()[1:1 + len(shapes)], shapes, strict=True):
            assert line.split()[:2] == [r["shape"], str(r["num_splits"])]


def test_macros_are_prefixed_unique_and_torch_free():
    names = [fn.__name__ for fn in report.MACROS]
    assert len(names) == len(set(names))
    assert all(n.startswith("paged_attention_") for n in names)
    code = ("import sys; from labs.paged_attention import report; report.paged_attention_results_table('H200'); "
            "assert 'torch' not in sys.modules and 'triton' not in sys.modules, sorted(sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_other_tables_show_the_recorded_numbers():
    """Group, ragged and fp8 tables: every row recorded under the table, its numbers as recorded."""
    for label, e in RECORDED.items():
        for table, macro, cells_of in (
            ("groups", report.paged_attention_group_table,
             lambda r: [r["group_size"], r["num_splits"], r["time_us"], r["floor_us"], r["copy_fraction"],
                        r["sdpa_time_us"], r["ratio_to_sdpa"]]),
            ("ragged", report.paged_attention_ragged_table,
             lambda r: [r["batch"], r["lens"]["total"], r["splits_total"], r["splits_max"], r["time_us"],
                        r["floor_us"], r["tb_s"], r["copy_fraction"]]),
            ("fp8", report.paged_attention_fp8_table,
             lambda r: [r["time_us"], round(r["kv_bytes"] / 2**20), r["tb_s"], r["copy_fraction"],
                        r["bf16_time_us"], r["speedup_vs_bf16"]]),
        ):
            rows = bench.table_rows(e["rows"], table)
            assert rows, f"{label} has no {table} rows recorded"
            md = macro(gpu=label)
            lines = [line for line in md.splitlines() if line.startswith("| `")]
            assert len(lines) == len(rows)
            assert e["gpu"] in md
            for day in {r["run"]["date"] for r in rows}:  # each run its rows come from is dated
                assert day in md, (table, day)
            for line, r in zip(lines, rows, strict=True):
                assert line.startswith(f"| `{r['shape']}` |")
                numbers = [float(x) for x in re.findall(r"(?<![\w.])\d[\d,]*\.?\d*", line.replace(",", ""))]
                for want in cells_of(r):
                    assert any(abs(n - want) <= 0.05 + 0.001 * abs(want) for n in numbers), (table, r["shape"], want, line)


def test_the_other_tables_say_when_nothing_is_recorded(results):
    results(TWO_GPUS)  # rows without a table are shapes: no group, ragged or fp8 rows
    for macro in (report.paged_attention_group_table, report.paged_attention_ragged_table,
                  report.paged_attention_fp8_table):
        md = macro(gpu="GPU Alpha")
        assert "No `" in md and "rows are recorded for GPU Alpha" in md and report.RECORD_COMMAND in md


def test_fp8_summary_quotes_the_recorded_extremes():
    """The sentence the fp8 pages render: lowest and highest speedup on B >= 16 and ragged rows, and errors."""
    for label, e in RECORDED.items():
        rows = bench.table_rows(e["rows"], "fp8")
        big = [r["speedup_vs_bf16"] for r in rows if r["kind"] == "ragged" or r["batch"] >= 16]
        text = report.paged_attention_fp8_summary(gpu=label)
        assert label in text and e["date"] in text
        assert f"{min(big):.2f}–{max(big):.2f}×" in text and f"on {len(big)} batches" in text
        assert f"{min(r['quant_rel_err'] for r in rows):.1%}" in text


def test_fp8_summary_says_when_nothing_is_recorded(results):
    results(TWO_GPUS)
    assert "No `fp8` rows are recorded for GPU Alpha" in report.paged_attention_fp8_summary(gpu="GPU Alpha")


def test_a_row_carries_its_program_count_wave_fill_and_share_of_the_dram_peak(results):
    """The figures the lab page quotes about a row, from the row and the kernel's constants."""
    results(TWO_GPUS)
    row = report.paged_attention_row("b2-l9k", gpu="GPU Alpha")
    raw = TWO_GPUS["GPU Alpha"]["rows"][1]
    per_sm = report.kernel_constant("RESIDENT_PROGRAMS")
    assert row["programs"] == raw["batch"] * raw["kv_heads"] == 8
    assert row["wave_fill"] == pytest.approx(8 / (TWO_GPUS["GPU Alpha"]["sm_count"] * per_sm))
    assert row["of_dram_peak"] is None  # no Nsight Compute peak noted for this GPU
    h200 = report.paged_attention_slots("h200")
    assert h200 == {"sm_count": 132, "per_sm": per_sm, "slots": 132 * per_sm}


def test_the_slot_count_is_the_kernels_own_constant():
    """Read from kernel.py's source, the value the launcher uses; a missing name is an error, not a guess."""
    source = report.KERNEL_SOURCE.read_text()
    assert f"\nRESIDENT_PROGRAMS = {report.kernel_constant('RESIDENT_PROGRAMS')}\n" in source
    with pytest.raises(report.ResultsError, match="no integer constant NOT_A_CONSTANT"):
        report.kernel_constant("NOT_A_CONSTANT")


def _fp8_row(shape: str, of: str, kind: str, batch: int, time_us: float, bf16_us: float,
             step: tuple[float, float] | None) -> dict:
    """An fp8 row as bench.main writes it; `step` = (fp8, bf16) µs per decode step, under the flush only."""
    kv_bytes = 2 * batch * 4096 * 8 * 128
    row = {
        "shape": shape, "of": of, "kind": kind, "batch": batch, "context_len": 4096, "q_heads": 32,
        "kv_heads": 8, "dtype": "bfloat16", "kv_dtype": "float8_e4m3fn", "v_layout": "token", "k_scale": 0.01,
        "v_scale": 0.02, "kernel": "cuda", "tile_n": 32, "num_warps": 16, "num_stages": 1, "kv_bytes": kv_bytes,
        "floor_us": 10.0, "time_us": time_us, "layers": 1, "rerun_spread": 0.001,
        "tb_s": round(kv_bytes / time_us / 1e6, 3), "copy_fraction": 0.9, "bf16_time_us": bf16_us,
        "speedup_vs_bf16": round(bf16_us / time_us, 3), "triton_time_us": 99.0,
        "triton_speedup_vs_bf16": round(bf16_us / 99.0, 3), "rel_err": 0.003, "quant_rel_err": 0.037,
        "bf16_rel_err": 0.002,
    }
    if step is not None:
        row.update({"step_layers": 8, "step_time_us": step[0], "step_bf16_time_us": step[1],
                    "step_speedup_vs_bf16": round(step[1] / step[0], 3)})
    return row


def test_fp8_rows_timed_per_step_print_and_render_both_timers(results):
    """Rows timed under the flush carry a per-step reading too: the printout, the target lines, the
    page's table and the summary sentence show both; rows without it show the flush columns alone."""
    stepped = [_fp8_row("b32-l4k-fp8", "b32-l4k", "shapes", 32, 82.2, 140.3, (70.8, 128.8)),
               _fp8_row("ragged-one-long-fp8", "ragged-one-long", "ragged", 64, 102.0, 176.8, (91.6, 164.5)),
               _fp8_row("b1-l4k-fp8", "b1-l4k", "shapes", 1, 17.2, 16.9, (12.7, 11.9))]
    entry = {**_entry("GPU Alpha", "2030-01-02", 4.25, "cudnn", []), "fp8_rows": stepped}

    printed = bench.format_all(entry).splitlines()
    assert printed[0] == bench.FP8_HEADER + bench.FP8_STEP_HEADER
    assert printed[1].split()[-3:] == ["70.8", "128.8", "1.819"]
    targets = bench.target_lines(entry)
    step_lines = [t for t in targets if " step_speedup_vs_bf16 " in t]
    assert [t.split()[0] for t in step_lines] == [r["shape"] for r in stepped]
    assert step_lines[0].endswith("pass") and step_lines[1].endswith("FAIL")  # 1.795 < 1.8
    assert step_lines[2].endswith("(no target)")  # B = 1
    assert targets[-1] == "targets missed: 3"  # flush: 1.707 and 1.733; per step: 1.795

    results({"GPU Alpha": entry})
    md = report.paged_attention_fp8_table(gpu="GPU Alpha")
    assert "| Per step (µs) | bf16 per step (µs) | Speedup per step |" in md and "8 copies" in md
    for r in stepped:
        line = next(x for x in md.splitlines() if x.startswith(f"| `{r['shape']}` |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[7:11] == [f"{r['speedup_vs_bf16']:.2f}×", f"{r['step_time_us']:,.1f}",
                               f"{r['step_bf16_time_us']:,.1f}", f"{r['step_speedup_vs_bf16']:.2f}×"]
    summary = report.paged_attention_fp8_summary(gpu="GPU Alpha")
    assert "1.71–1.73× as fast as bf16 (1.80–1.82× timed as one layer of a decode step) on 2 batches" in summary

    plain = [{k: v for k, v in r.items() if not k.startswith("step_")} for r in stepped]
    results({"GPU Alpha": {**entry, "fp8_rows": plain}})
    assert "Per step" not in report.paged_attention_fp8_table(gpu="GPU Alpha")
    assert "decode step" not in report.paged_attention_fp8_summary(gpu="GPU Alpha")
    assert not any(" step_speedup_vs_bf16 " in t for t in bench.target_lines({"fp8_rows": plain}))
    assert bench.format_all({"fp8_rows": plain}).splitlines()[0] == bench.FP8_HEADER
