"""The engine benchmark's pieces that run without a GPU: fused kernels, the CLI's refusals, the trace, the page macros."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from labs.engine import bench, fused, report  # noqa: E402
from labs.engine.model import RMSNorm, rotate_half  # noqa: E402


def test_fused_kernels_match_the_torch_ops_in_float32():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(96, generator=g)
    x, r = torch.randn(5, 96, generator=g), torch.randn(5, 96, generator=g)
    norm = RMSNorm(96, 1e-5)
    norm.weight.data = w
    out, res = fused.add_rms_norm(x, w, 1e-5, r)
    assert torch.equal(res, x + r)
    torch.testing.assert_close(out, norm(x + r), rtol=1e-6, atol=1e-6)
    out, res = fused.add_rms_norm(x, w, 1e-5)
    assert res is x
    torch.testing.assert_close(out, norm(x), rtol=1e-6, atol=1e-6)

    heads, kv_heads, d, t = 4, 2, 16, 3
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=g)
    inv = 1 / 10000 ** (torch.arange(0, d, 2).float() / d)
    f = torch.arange(t).float()[:, None] * inv
    emb = torch.cat((f, f), -1)[:, None, :]
    cos, sin = emb.cos(), emb.sin()
    q, k = fused.rope(qkv, cos, sin, heads, kv_heads, d)
    q_ref = qkv[:, :heads * d].view(t, heads, d)
    k_ref = qkv[:, heads * d:(heads + kv_heads) * d].view(t, kv_heads, d)
    torch.testing.assert_close(q, q_ref * cos + rotate_half(q_ref) * sin, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k, k_ref * cos + rotate_half(k_ref) * sin, rtol=1e-6, atol=1e-6)

    gate_up = torch.randn(4, 2 * 1500, generator=g)  # not a multiple of the kernel's block
    gate, up = gate_up.chunk(2, -1)
    torch.testing.assert_close(fused.silu_mul(gate_up), torch.nn.functional.silu(gate) * up, rtol=1e-5, atol=1e-6)


def test_the_stored_trace_is_what_its_header_says():
    trace = bench.load_trace()
    assert len(trace) == 96
    assert all(64 <= p <= 1024 and 16 <= o <= 256 for _, p, o in trace)
    assert [a for a, _, _ in trace] == sorted(a for a, _, _ in trace)


@pytest.mark.parametrize("argv, needle", [
    (["--only", "decode,nope"], "--only"),
    (["--reps", "0"], "--reps"),
    (["--budget-s", "nan"], "--budget-s"),
    (["--device", "tpu"], "--device"),
    (["--model", "mistral-7b"], "--model"),  # in models.yaml, but not a model the engine builds
])
def test_bad_arguments_exit_2_with_one_line(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_cpu_run_is_never_recorded(capsys):
    assert bench.main(["--record", "--device", "cpu"]) == 2
    assert "--record" in capsys.readouterr().err


def test_report_renders_recorded_rows_and_refuses_unknown_sections():
    if not report.engine_recorded("H200"):
        pytest.skip("no H200 rows recorded")
    table = report.engine_table("decode", "H200", where="context=128")
    assert table.splitlines()[0].startswith("| L | B | CUDA graphs |")
    assert "| 128 | 1 | on |" in table
    assert "TB/s" in report.engine_env("H200")
    step = report.engine_value("decode/L128/B1/graphs", "step_ms", "H200")
    assert report.engine_ratio("decode/L128/B1/graphs", "step_ms", "step_ms", "H200") == "1.00x" and step > 0
    with pytest.raises(report.ResultsError, match="unknown section"):
        report.engine_table("nope", "H200")
    with pytest.raises(report.ResultsError, match="no field"):
        report.engine_value("decode/L128/B1/graphs", "nope", "H200")


def _decode_row(batch, context, step_ms, floor_ms, graphs=True):
    return {"name": f"decode/L{context}/B{batch}/{'graphs' if graphs else 'eager'}", "section": "decode", "ok": True,
            "context": context, "batch": batch, "cuda_graphs": graphs, "step_ms": step_ms, "floor_ms": floor_ms,
            "tok_s": batch / step_ms * 1e3}


def test_report_decode_rows_by_shape_beside_the_datasheet_floor(tmp_path, monkeypatch):
    """engine_decode finds a row by (context, batch), prices the same step at the datasheet and gives both gaps."""
    from labs import roofline
    from labs.recorded import Machine, record_rows

    path = tmp_path / "engine.json"
    rows = [_decode_row(1, 1024, 5.0, 3.5), _decode_row(64, 1024, 8.0, 5.0), _decode_row(111, 8192, 40.0, 30.0),
            _decode_row(64, 8192, 25.0, 19.0), _decode_row(1, 1024, 20.0, 3.5, graphs=False),
            {"name": "offline/C64", "section": "offline", "ok": True, "output_tok_s": 2000.0, "sim_output_tok_s": 5000.0},
            {"name": "hf/C64/eager", "section": "hf", "ok": True, "output_tok_s": 200.0}]
    record_rows(path, "engine", Machine("NVIDIA H200"), rows, ["name"],
                {"date": "2026-12-01", "model": "llama-3.1-8b", "copy_tb_s": 4.2, "gemm_tflops": 690.0})
    monkeypatch.setattr(report, "RESULTS_PATH", path)
    d = roofline.deployment("llama-3.1-8b", "h200")
    e = report.engine_decode(1024, 64, "H200")
    assert e["step_ms"] == 8.0 and e["over_floor"] == pytest.approx(8.0 / 5.0)
    assert e["model_floor_ms"] == pytest.approx(d.decode(64, 1024).floor_s * 1e3)
    assert e["over_model"] == pytest.approx(8.0 / (d.decode(64, 1024).floor_s * 1e3))
    assert e["attained_flops_per_s"] == pytest.approx(d.decode(64, 1024).flops / 8e-3)
    assert e["attained_fraction"] == pytest.approx(e["attained_flops_per_s"] / d.flops_per_s)
    assert e["step_growth"] == pytest.approx(8.0 / 5.0) and e["throughput_gain"] == pytest.approx(64 * 5.0 / 8.0)
    assert e["model_throughput_gain"] == pytest.approx(d.throughput_gain(64, 1024))
    assert report.engine_decode(1024, 1, "H200", graphs=False)["step_ms"] == 20.0
    top = report.engine_decode(8192, "largest", "H200")
    assert top["batch"] == 111 and "step_growth" not in top  # no B = 1 row at that context
    with pytest.raises(report.ResultsError, match=r"batches recorded at that context: \[64, 111\]"):
        report.engine_decode(8192, 16, "H200")
    assert report.engine_sim_error("offline/C64", "output_tok_s", "H200") == "+150%"
    assert report.engine_over("offline/C64", "hf/C64/eager", "output_tok_s", "H200") == "10.0x"
    assert report.engine_has("hf/C64/eager", "H200") and not report.engine_has("hf/C1/eager", "H200")


def test_decode_table_keeps_only_the_rungs_the_latest_pool_held():
    rows = [{"context": 1024, "batch": 1, "pool_batch": 868}, {"context": 1024, "batch": 868, "pool_batch": 868},
            {"context": 1024, "batch": 882, "pool_batch": 882}, {"context": 128, "batch": 4, "pool_batch": 99}]
    assert [r["batch"] for r in report._latest_ladder(rows)] == [1, 868, 4]


def test_a_cpu_smoke_run_writes_its_rows_into_a_new_folder(tmp_path, monkeypatch):
    """The chunked section, warm-up included, runs end to end; --out need not exist yet."""
    monkeypatch.setattr(bench, "QUICK_CHUNK_BUDGETS", (64,))  # one budget: the interpreter is slow
    out = tmp_path / "new" / "engine"
    assert bench.main(["--device", "cpu", "--layers", "1", "--quick", "--only", "chunked", "--out", str(out)]) == 0
    rows = json.loads((out / "bench.json").read_text())["rows"]
    assert [r["name"] for r in rows] == ["chunked/64", "chunked/off"]
    assert all(r["ttft_ms"] > 0 and r["worst_gap_ms"] > 0 for r in rows)
