"""The quantization lab on the CPU: schemes against hand-computed grids, methods beating RTN where they
should, the Triton weight-only kernels (interpreter) against dequantise-then-matmul, and bad CLI input."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import HAS_CUDA

from labs.quantization import methods, synthetic
from labs.quantization.schemes import Scheme, SchemeError, fake_quant, rel_error


def test_symmetric_int_grid_and_storage_cost():
    w = np.array([[1.0, -0.5, 0.25, 7.0]])
    out = fake_quant(w, Scheme("int4", "channel"))
    assert np.allclose(out, np.round(w / 1.0) * 1.0)  # amax 7 over qmax 7: step 1
    assert Scheme("int4", "group", 128).bits_per_value() == pytest.approx(4.125)
    assert Scheme("int4", "group", 128, symmetric=False).bits_per_value() == pytest.approx(4.15625)


def test_asymmetric_uses_the_whole_range():
    w = np.linspace(0.0, 15.0, 16)[None, :]  # all positive: symmetric wastes half the grid
    assert np.allclose(fake_quant(w, Scheme("int4", "channel", symmetric=False)), w)
    assert rel_error(fake_quant(w, Scheme("int4", "channel")), w) > 0.01


def test_fp8_uses_number_formats_rounding():
    from labs.number_formats import FORMATS

    e4m3 = next(f for f in FORMATS if f.name == "fp8-e4m3")
    w = np.array([[448.0, 1.0625, -3.3]])  # amax 448: scale 1, so the grid is E4M3's own
    assert np.array_equal(fake_quant(w, Scheme("fp8-e4m3", "tensor")), e4m3.round(w))


def test_bad_schemes_are_refused():
    for bad in (dict(fmt="int3"), dict(fmt="int4", granularity="row"), dict(fmt="fp8-e4m3", symmetric=False),
                dict(fmt="int4", granularity="group")):
        with pytest.raises(SchemeError):
            Scheme(**bad)
    with pytest.raises(SchemeError, match="multiple"):
        fake_quant(np.ones((2, 100)), Scheme("int4", "group", 64))


def test_finer_granularity_never_hurts_on_outlier_weights():
    w = synthetic.weights(64, 512)
    errs = [rel_error(fake_quant(w, Scheme("int4", g, gs)), w)
            for g, gs in (("tensor", None), ("channel", None), ("group", 128), ("group", 32))]
    assert errs == sorted(errs, reverse=True)


def test_per_tensor_int8_activations_break_on_outlier_channels():
    x = synthetic.activations(128, 512)
    bulk = np.setdiff1d(np.arange(512), synthetic.outlier_channels(512))
    per_tensor = fake_quant(x, Scheme("int8", "tensor"))
    per_token = fake_quant(x, Scheme("int8", "channel"))
    assert rel_error(per_tensor[:, bulk], x[:, bulk]) > 0.1  # the bulk gets a handful of levels
    assert rel_error(per_token[:, bulk], x[:, bulk]) < rel_error(per_tensor[:, bulk], x[:, bulk])
    xg = synthetic.activations(128, 512, gaussian=True)
    assert rel_error(fake_quant(xg, Scheme("int8", "tensor")), xg) < 0.02  # Gaussian flatters


def test_smoothquant_alpha_half_beats_no_smoothing():
    w, x = synthetic.weights(64, 512), synthetic.activations(256, 512, seed=5)
    a, wt = Scheme("int8", "tensor"), Scheme("int8", "channel")
    assert methods.w8a8_output_error(x, w, a, wt, 0.5) < 0.5 * methods.w8a8_output_error(x, w, a, wt)


@pytest.fixture(scope="module")
def layer():
    w = synthetic.weights(64, 256)
    return w, synthetic.activations(1024, 256, seed=11), synthetic.activations(256, 256, seed=12)


def test_gptq_and_awq_beat_rtn_on_held_out_inputs(layer):
    w, calib, test = layer
    s = Scheme("int4", "group", 128)
    rtn = methods.output_error(test, w, methods.rtn(w, s))
    assert methods.output_error(test, w, methods.gptq(w, calib, s)) < rtn
    w_awq, alpha = methods.awq(w, calib, s)
    assert methods.output_error(test, w, w_awq) < rtn and alpha > 0


def test_gptq_without_error_feedback_is_rtn(layer):
    """With H = identity, GPTQ's updates vanish: each column rounds as RTN would."""
    w, _, _ = layer
    s = Scheme("int4", "group", 128)
    q = methods.gptq(w, np.eye(256) * 10, s, damp=0.0)
    assert np.allclose(q, methods.rtn(w, s))


def test_gptq_lazy_blocks_change_nothing(layer):
    w, calib, _ = layer
    s = Scheme("int4", "channel")
    assert np.allclose(methods.gptq(w, calib, s, block=128), methods.gptq(w, calib, s, block=16))


@pytest.mark.parametrize("bits,group", [(8, None), (4, 64), (4, 128)])
@pytest.mark.parametrize("m,n,k", [(1, 64, 128), (5, 96, 256), (17, 32, 128)])
def test_weight_only_kernel_matches_dequantise_then_matmul(bits, group, m, n, k):
    torch = pytest.importorskip("torch")
    if group and k % group:
        pytest.skip("K not a multiple of g")
    from labs.quantization import kernels

    dev = "cuda" if HAS_CUDA else "cpu"
    g = torch.Generator().manual_seed(m * n + k)
    x = torch.randn((m, k), generator=g).to(dev, torch.float16)
    w = torch.randn((n, k), generator=g).to(dev)
    if bits == 8:
        q, s = kernels.quantize_int8(torch, w)
        ref = x.float() @ kernels.dequantize_int8(torch, q, s, torch.float32).t()
        y = kernels.weight_only_gemm(torch, x, q, s, 8)
    else:
        q, s = kernels.quantize_int4(torch, w, group)
        ref = x.float() @ kernels.dequantize_int4(torch, q, s, group, torch.float32).t()
        y = kernels.weight_only_gemm(torch, x, q, s, 4, group=group)
    assert y.shape == (m, n)
    assert ((y.float() - ref).norm() / ref.norm()).item() < 2e-3


def test_int4_packing_round_trips():
    torch = pytest.importorskip("torch")
    from labs.quantization import kernels

    w = torch.randn(8, 128)
    q, s = kernels.quantize_int4(torch, w, 64)
    assert q.shape == (8, 64) and q.dtype == torch.uint8 and s.shape == (8, 2)
    back = kernels.dequantize_int4(torch, q, s, 64, torch.float32)
    assert ((back - w).abs() <= s.repeat_interleave(64, dim=1) / 2 + 1e-6).all()


def test_error_cli_quick_run_and_bad_arguments(tmp_path, capsys):
    from labs.quantization import error

    assert error.main(["--quick", "--out", str(tmp_path)]) == 0
    from labs import recorded

    res = recorded.load_results(tmp_path / "quantization_error.json")
    rows = res.machine(error.MACHINE.label).rows
    assert {r["table"] for r in rows} == set(error.TABLES)
    with pytest.raises(SystemExit) as e:
        error.main(["--quick", "--record"])
    assert e.value.code == 2


def test_speed_cli_refuses_bad_reps():
    from labs.quantization import speed

    with pytest.raises(SystemExit) as e:
        speed.main(["--reps", "0"])
    assert e.value.code == 2


def test_bytes_read_orders_the_variants():
    from labs.quantization import speed

    b = {v: speed.bytes_read(v, 1, 4096, 4096) for v in speed.VARIANTS}
    assert b["int4-wo"] < b["int8-wo"] < b["bf16"] and b["fp8-gemm"] < b["bf16"]


@pytest.mark.gpu
def test_speed_variants_are_correct_on_the_gpu():
    if not HAS_CUDA:
        pytest.skip("needs a CUDA GPU")
    import torch

    from labs.quantization import speed

    rows, wrong = speed.run(torch, lambda fn: type("S", (), {"median_us": 1.0})(), log=lambda *_: None)
    assert not wrong
    assert all(r["ok"] for r in rows if r["variant"] in ("bf16", "int8-wo", "int4-wo"))


@pytest.mark.parametrize("bits", [8, 4])
def test_weight_only_kernel_with_wide_tiles_on_a_ragged_n(bits):
    """BLOCK_N = 64 on N = 96: the second column tile is half masked."""
    torch = pytest.importorskip("torch")
    from labs.quantization import kernels

    dev = "cuda" if HAS_CUDA else "cpu"
    g = torch.Generator().manual_seed(bits)
    x = torch.randn((3, 128), generator=g).to(dev, torch.float16)
    w = torch.randn((96, 128), generator=g).to(dev)
    if bits == 8:
        q, s = kernels.quantize_int8(torch, w)
        ref = x.float() @ kernels.dequantize_int8(torch, q, s, torch.float32).t()
    else:
        q, s = kernels.quantize_int4(torch, w, 64)
        ref = x.float() @ kernels.dequantize_int4(torch, q, s, 64, torch.float32).t()
    y = kernels.weight_only_gemm(torch, x, q, s, bits, group=64, block_n=64)
    assert ((y.float() - ref).norm() / ref.norm()).item() < 2e-3


def test_speed_rows_print_with_a_failed_variant_or_baseline():
    from labs.quantization import speed

    ok = {"layer": "k_proj/v_proj", "m": 1, "variant": "int4-wo", "ok": True, "time_us": 5.0, "vs_bf16": None,
          "bytes": 2_100_000, "gb_s": 420.0, "tflop_s": 1.7}
    bad = {"layer": "k_proj/v_proj", "m": 1, "variant": "fp8-gemm", "ok": False, "error": "RuntimeError: no fp8"}
    text = speed.printed({"gemm": [ok, bad]})["all"]
    assert "failed: RuntimeError: no fp8" in text and "int4-wo" in text
