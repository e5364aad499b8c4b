"""The KV-sizing and OOM labs' page macros (labs/*/report.py) show the labs' own numbers (CPU, no torch).

A page built from these functions must say what `budget(...)` computes and what
the recorded GPU runs hold, digit for digit; when a results file is missing it
must say so and give the command that records it.
"""

from __future__ import annotations

import re

import pytest

from labs import recorded, specs
from labs.kv_sizing import budget
from labs.kv_sizing import report as kv_report
from labs.kv_sizing.memory_budget import GIB
from labs.oom import report as oom_report
from labs.oom.transcript import format_report

BUDGET_CASES = [
    ("llama-3.1-8b", "h200", 8192, {}),
    ("qwen3-8b", "h100-sxm", 32768, {"kv_cache_dtype": "fp8"}),
    ("llama-3.1-70b", "h200", 32768, {"tensor_parallel_size": 2}),
    ("deepseek-v3", "h200", 32768, {"tensor_parallel_size": 8}),
    ("gemma-3-12b", "h100-sxm", 32768, {}),
]
OOM_SCENARIOS = ["kv-too-small", "prefill-activation", "two-instances", "fragmentation"]
GPU = "H200"  # the machine the recorded files hold; every macro names the one it shows


def _check_run():
    return recorded.load_results(kv_report.CHECK_RESULT).machine(GPU)


def _oom_run():
    return recorded.load_results(oom_report.RESULT).machine(GPU)


def _rows(markdown: str) -> dict[str, list[str]]:
    """Body rows of the Markdown tables, by their first cell (bold markers dropped; header rows skipped)."""
    rows = {}
    lines = markdown.splitlines()
    for line, after in zip(lines, lines[1:] + [""]):
        if line.startswith("| ") and not after.startswith("|---"):
            cells = [c.strip().replace("**", "") for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


# ---------------------------------------------------------------------------
# KV sizing
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("model,gpu,length,kw", BUDGET_CASES, ids=[c[0] for c in BUDGET_CASES])
def test_budget_table_shows_budget_fields(model, gpu, length, kw):
    b = budget(specs.get_model(model), specs.get_gpu(gpu), length, **kw)
    rows = _rows(kv_report.kv_budget_table(model, gpu, length, **kw))
    gib = lambda n: f"{n / GIB:,.2f} GiB"  # noqa: E731
    assert rows["Total memory"][0] == gib(b.total_memory)
    assert rows[f"× `gpu_memory_utilization` {b.gpu_memory_utilization} = requested"][0] == gib(b.requested_memory)
    assert rows["− weights"][0] == gib(b.weights)
    assert rows["− activation peak (profiling pass)"][0] == gib(b.activation_peak)
    assert rows["− non-torch memory"][0] == gib(b.non_torch)
    assert rows["− CUDA graphs"][0] == gib(b.cudagraph)
    assert rows["= KV pool"][0] == gib(b.kv_pool)
    assert rows["÷ bytes per block"][0] == f"{b.bytes_per_block:,} B"
    assert rows["= blocks"][0] == f"{b.num_blocks:,}"
    assert rows[f"blocks one {length:,}-token request needs"][0] == f"{b.blocks_per_request:,}"
    assert rows["maximum concurrency"][0] == f"{b.max_concurrency:,.2f}×"
    assert rows["GPU KV cache size"][0] == f"{b.kv_cache_tokens:,} tokens"
    # The itemised lines add up to the pool, as vLLM subtracts them.
    assert b.requested_memory - b.weights - b.activation_peak - b.non_torch - b.cudagraph == b.kv_pool


def test_budget_table_marks_estimates_and_given_terms():
    estimated = _rows(kv_report.kv_budget_table("llama-3.1-8b", "h200", 8192))
    given = _rows(kv_report.kv_budget_table("llama-3.1-8b", "h200", 8192, activation_peak=GIB, non_torch=GIB,
                                            cudagraph=GIB))
    assert estimated["− CUDA graphs"][1] == "labelled estimate"
    assert given["− CUDA graphs"] == ["1.00 GiB", "given"]


def test_budget_table_carries_vllms_refusal():
    text = kv_report.kv_budget_table("llama-3.1-70b", "h100-sxm", 32768, tensor_parallel_size=2)
    b = budget(specs.get_model("llama-3.1-70b"), specs.get_gpu("h100-sxm"), 32768, tensor_parallel_size=2)
    assert b.error and f"vLLM would refuse to start: {b.error}" in text


def test_budget_matrix_picks_smallest_fitting_tp():
    rows = _rows(kv_report.kv_budget_matrix(["llama-3.1-8b", "llama-3.1-70b", "deepseek-v3"], ["h100-sxm", "h200"],
                                            32768))
    m70, h200 = specs.get_model("llama-3.1-70b"), specs.get_gpu("h200")
    at1 = budget(m70, h200, 32768, tensor_parallel_size=1)
    at2 = budget(m70, h200, 32768, tensor_parallel_size=2)
    assert at1.error and not at2.error  # 70B does not start on one H200, does on two
    assert rows[m70.display_name][1] == f"{at2.max_concurrency:,.1f}× on 2 GPUs"
    b8 = budget(specs.get_model("llama-3.1-8b"), specs.get_gpu("h100-sxm"), 32768)
    assert rows[specs.get_model("llama-3.1-8b").display_name][0] == f"{b8.max_concurrency:,.1f}× on 1 GPU"
    assert rows[specs.get_model("deepseek-v3").display_name][0] == "no TP ≤ 8 fits"


def test_knobs_table_rows_are_budgets():
    rows = _rows(kv_report.kv_knobs_table("qwen3-8b", "h100-sxm", 32768, target=32))
    m, g = specs.get_model("qwen3-8b"), specs.get_gpu("h100-sxm")
    base, fp8 = budget(m, g, 32768), budget(m, g, 32768, kv_cache_dtype="fp8")
    assert rows["defaults"][4] == f"{base.max_concurrency:,.2f}×"
    assert rows["`--kv-cache-dtype fp8`"][2] == f"{2 * base.num_blocks:,}" == f"{fp8.num_blocks:,}"
    assert rows["`--max-model-len` halved"][3] == "16,384"
    both = budget(m, g, 32768, kv_cache_dtype="fp8", tensor_parallel_size=2)
    assert rows["`--kv-cache-dtype fp8 --tensor-parallel-size 2`"][-2:] == [f"{int(both.max_concurrency)}", "yes"]
    assert rows["defaults"][-1] == "no"


def test_cli_macro_prints_what_the_cli_prints(capsys):
    from labs.kv_sizing.__main__ import main

    args = "--model qwen3-8b --gpu h100-sxm --max-model-len 32768 --kv-cache-dtype fp8"
    text = kv_report.kv_sizing_cli(args)
    main(args.split())
    printed = capsys.readouterr().out.rstrip()
    assert text.startswith(f"```bash\npython -m labs.kv_sizing {args}\n```")
    assert f"```text\n{printed}\n```" in text


def test_cli_macro_refuses_bad_arguments():
    with pytest.raises(kv_report.ReportError, match="unknown model"):
        kv_report.kv_sizing_cli("--model no-such-model")


def test_alloc_check_table_shows_recorded_numbers():
    m = _check_run()
    text = kv_report.kv_alloc_check_table(gpu=GPU)
    assert m.label in text and m.rows[0]["run"]["date"] in text and "580.159.04" in text
    for cfg in m.rows:
        assert f"{cfg['budget']['num_blocks']:,} blocks × {cfg['budget']['bytes_per_block']:,} B" in text
        block = kv_report.kv_alloc_check_table(cfg["label"], gpu=GPU)
        for row in cfg["rows"]:
            line = next(ln for ln in block.splitlines() if ln.startswith(f"| {row['item']} |"))
            if not kv_report._is_flag(row):
                assert f"{row['predicted']:,}" in line and f"{row['measured']:,}" in line, line


def test_alloc_check_one_label_and_bad_label():
    text = kv_report.kv_alloc_check_table("gqa-fp8-kv", gpu=GPU)
    assert "gqa-fp8-kv" in text and "gqa-bf16" not in text
    with pytest.raises(kv_report.ReportError, match="labels on NVIDIA H200 are"):
        kv_report.kv_alloc_check_table("nope", gpu=GPU)


def test_alloc_check_for_a_gpu_not_recorded_names_the_recorded_ones():
    with pytest.raises(kv_report.ReportError, match=r"gpu='A100'.*recorded: \['NVIDIA H200'\]"):
        kv_report.kv_alloc_check_summary(gpu="A100")


def test_alloc_check_summary_matches_json():
    text = kv_report.kv_alloc_check_summary(gpu=GPU)
    for cfg in _check_run().rows:
        admitted = next(r for r in cfg["rows"] if "requests admitted" in r["item"])
        assert f"{admitted['predicted']:,} / {admitted['measured']:,}" in text


def test_missing_check_file_says_how_to_record(tmp_path):
    for fn in (kv_report.kv_alloc_check_table, kv_report.kv_alloc_check_summary):
        text = fn(gpu=GPU, path=str(tmp_path / "kv_alloc_check.json"))
        assert "does not exist" in text and "python -m labs.kv_sizing.check --out" in text and "--record" in text


# ---------------------------------------------------------------------------
# OOM
# ---------------------------------------------------------------------------


def test_recorded_transcripts_are_the_cli_text_of_their_numbers():
    """Each stored transcript is exactly what the CLI prints for the numbers stored beside it."""
    rows = _oom_run().rows
    assert sorted(r["scenario"] for r in rows) == sorted(OOM_SCENARIOS)
    for r in rows:
        report = {k: v for k, v in r.items() if k not in ("ok", "run")}
        assert r["transcript"] == format_report(report), r["scenario"]


@pytest.mark.parametrize("name", OOM_SCENARIOS)
def test_oom_scenario_shows_recorded_output(name):
    m = _oom_run()
    r = m.row(scenario=name)
    text = oom_report.oom_scenario(name, gpu=GPU)
    assert text.startswith("```text\n=== " + name + " ===")
    for part in (r["failure"]["error"], r["diagnosis"]["cause"], r["diagnosis"]["knob"], r["fix"]["knob"]):
        assert part in text
    assert m.label in text and r["run"]["date"] in text


def test_oom_scenario_unknown_name():
    with pytest.raises(oom_report.ReportError, match="recorded"):
        oom_report.oom_scenario("out-of-disk", gpu=GPU)


def test_oom_result_is_the_recorded_report(tmp_path):
    assert oom_report.oom_result("fragmentation", gpu=GPU) == _oom_run().row(scenario="fragmentation")
    with pytest.raises(oom_report.ReportError, match="--record"):
        oom_report.oom_result("fragmentation", gpu=GPU, path=str(tmp_path / "oom.json"))


def test_oom_prefill_peaks_table_matches_json():
    r = _oom_run().row(scenario="prefill-activation")
    rows = _rows(oom_report.oom_prefill_peaks_table(gpu=GPU))
    for p in r["peak_vs_tokens"]:
        row = rows[f"{p['batched_tokens']:,}"]
        measured = float(re.sub(r"[^\d.]", "", row[0])) * (2**30 if "GiB" in row[0] else 2**20)
        assert measured == pytest.approx(p["peak_bytes"], rel=0.01)
        assert row[1] == f"{p['peak_bytes'] / p['batched_tokens'] / 1024:,.0f} KiB"


def test_oom_summary_lists_every_scenario():
    rows = _rows(oom_report.oom_summary_table(gpu=GPU))
    assert set(rows) == {f"`{n}`" for n in OOM_SCENARIOS}
    assert all(r[3] == "passed" and r[4] == "yes" for r in rows.values())


def test_missing_oom_file_says_how_to_record(tmp_path):
    missing = str(tmp_path / "oom.json")
    for text in (oom_report.oom_scenario("fragmentation", gpu=GPU, path=missing),
                 oom_report.oom_summary_table(gpu=GPU, path=missing),
                 oom_report.oom_prefill_peaks_table(gpu=GPU, path=missing)):
        assert "does not exist" in text and "python -m labs.oom --scenario" in text and "--record" in text


def test_every_macro_name_is_unique_and_prefixed():
    names = [f.__name__ for f in kv_report.MACROS + oom_report.MACROS]
    assert len(names) == len(set(names))
    assert all(n.startswith(("kv_", "oom_")) for n in names)
