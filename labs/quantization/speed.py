"""python -m labs.quantization.speed: decode-size GEMMs per Llama-8B projection, bf16 vs fp8 W8A8 vs weight-only int8/int4.

    python3 -m labs.quantization.speed --out out/quant --record
    python3 -m labs.quantization.speed --reps 10 --out out/quant

For each distinct projection shape (N, K) and M in 1..256, five variants:
- bf16: torch.nn.functional.linear on bf16 weights (cuBLAS);
- fp8-gemm: torch._scaled_mm on e4m3 activations and weights, per-tensor scales,
  activations already quantized (the GEMM alone);
- fp8-w8a8: the same with the activation's dynamic per-tensor quantization counted
  (amax, divide, clamp, cast in plain PyTorch ops, as an unfused path would do);
- int8-wo, int4-wo: the Triton weight-only kernels of labs/quantization/kernels.py.
Each variant is checked against an fp32 product of its own dequantized operands before it
is timed. A variant that raises (an unsupported shape, no fp8 on this GPU) is recorded as
"ok": false with the error and the rest go on; a wrong result makes the exit status 1, and
nothing is recorded from a run with a wrong result. Bytes read = weights (+ scales) + X + Y.
"""

from __future__ import annotations

import sys

from labs.gpu_harness import bench
from labs.gpu_harness.results import RESULTS_DIR

LAB = "quantization_speed"
RESULTS_PATH = RESULTS_DIR / f"{LAB}.json"
EXPERIMENTS = ("gemm",)
SHAPES = {"q_proj/o_proj": (4096, 4096), "k_proj/v_proj": (1024, 4096), "gate_proj/up_proj": (14336, 4096),
          "down_proj": (4096, 14336)}
MS = (1, 4, 16, 64, 128, 256)
VARIANTS = ("bf16", "fp8-gemm", "fp8-w8a8", "int8-wo", "int4-wo")
GROUP = 128
MATCH_REL_ERR = 2e-2  # vs fp32 on the variant's own dequantized operands: bf16/fp8 output rounding only
E4M3_MAX = 448.0


def config_name(experiment: str, row: dict) -> str:
    return f"{row['layer']}-M{row['m']}-{row['variant']}"


HEADER = f"{'layer':<18} {'M':>4} {'variant':<9} {'time us':>9} {'vs bf16':>8} {'MB read':>8} {'GB/s':>7} {'TFLOP/s':>8}"


def format_row(r: dict) -> str:
    if not r.get("ok", True):
        return f"{r['layer']:<18} {r['m']:>4} {r['variant']:<9} failed: {r['error']}"
    vs = "-" if r.get("vs_bf16") is None else f"{r['vs_bf16']:.3f}"  # bf16 itself failed at this M
    return (f"{r['layer']:<18} {r['m']:>4} {r['variant']:<9} {r['time_us']:>9.1f} {vs:>8} "
            f"{r['bytes'] / 1e6:>8.1f} {r['gb_s']:>7.0f} {r['tflop_s']:>8.1f}")


def printed(sections: dict) -> dict[str, str]:
    return {"all": "\n".join([HEADER, *map(format_row, sections.get("gemm", []))])}


def bytes_read(variant: str, m: int, n: int, k: int) -> int:
    act = m * k * (1 if variant.startswith("fp8") else 2) + m * n * 2
    weight = {"bf16": 2 * n * k, "fp8-gemm": n * k, "fp8-w8a8": n * k, "int8-wo": n * k + 4 * n,
              "int4-wo": n * k // 2 + 4 * n * (k // GROUP)}[variant]
    return act + weight + (m * k * 2 if variant == "fp8-w8a8" else 0)  # w8a8 reads the bf16 X once more


def _variants(torch, n: int, k: int):
    """{variant: (make_fn(x) -> callable, reference(x) -> fp32 result)} for one weight."""
    from labs.quantization import kernels

    g = torch.Generator(device="cuda").manual_seed(n + k)
    w = torch.randn((n, k), device="cuda", generator=g) * 0.02
    wb = w.to(torch.bfloat16)
    w_scale = (w.abs().amax() / E4M3_MAX).float()
    w8 = (w / w_scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    q8, s8 = kernels.quantize_int8(torch, w)
    q4, s4 = kernels.quantize_int4(torch, w, GROUP)
    w8_t = w8.t()  # column-major, as _scaled_mm wants its second operand

    def quant_act(x):
        scale = (x.abs().amax().float() / E4M3_MAX).clamp_min(1e-12)
        return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale

    def fp8_ref(x):
        xq, xs = quant_act(x)
        return (xq.float() * xs) @ (w8.float() * w_scale).t()

    def fp8_gemm(x):
        xq, xs = quant_act(x)
        return lambda: torch._scaled_mm(xq, w8_t, scale_a=xs, scale_b=w_scale, out_dtype=torch.bfloat16)

    def fp8_w8a8(x):
        def run():
            xq, xs = quant_act(x)
            return torch._scaled_mm(xq, w8_t, scale_a=xs, scale_b=w_scale, out_dtype=torch.bfloat16)
        return run

    return {
        "bf16": (lambda x: (lambda: torch.nn.functional.linear(x, wb)), lambda x: x.float() @ wb.float().t()),
        "fp8-gemm": (fp8_gemm, fp8_ref),
        "fp8-w8a8": (fp8_w8a8, fp8_ref),
        "int8-wo": (lambda x: (lambda: kernels.weight_only_gemm(torch, x, q8, s8, 8)),
                    lambda x: x.float() @ kernels.dequantize_int8(torch, q8, s8, torch.float32).t()),
        "int4-wo": (lambda x: (lambda: kernels.weight_only_gemm(torch, x, q4, s4, 4, group=GROUP)),
                    lambda x: x.float() @ kernels.dequantize_int4(torch, q4, s4, GROUP, torch.float32).t()),
    }


def run(torch, time, log=print) -> tuple[list[dict], list[str]]:
    """All rows and the list of wrong results (empty when every checked variant matched)."""
    rows, wrong = [], []
    log(HEADER)
    for layer, (n, k) in SHAPES.items():
        variants = _variants(torch, n, k)
        for m in MS:
            x = torch.randn((m, k), device="cuda", dtype=torch.bfloat16)
            base = None
            for name in VARIANTS:
                make, ref = variants[name]
                r = {"layer": layer, "n": n, "k": k, "m": m, "variant": name}
                try:
                    fn = make(x)
                    out = fn()
                    expect = ref(x)
                    err = ((out.float() - expect).norm() / expect.norm()).item()
                    if not err <= MATCH_REL_ERR:
                        wrong.append(f"{config_name('gemm', r)}: relative error {err:.3g} > {MATCH_REL_ERR}")
                        r.update(ok=False, error=f"wrong result (rel. error {err:.3g})")
                    else:
                        t = time(fn).median_us
                        base = t if name == "bf16" else base
                        nbytes = bytes_read(name, m, n, k)
                        r.update(ok=True, time_us=round(t, 2), rel_err=float(f"{err:.3g}"), bytes=nbytes,
                                 vs_bf16=round(base / t, 3) if base else None,
                                 gb_s=round(nbytes / t / 1e3, 1), tflop_s=round(2 * m * n * k / t / 1e6, 2))
                except Exception as e:  # an unsupported variant: record why, measure the rest
                    r.update(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
                log(format_row(r))
                rows.append(r)
            del x
    return rows, wrong


def main(argv: list[str] | None = None) -> int:
    p = bench.parser("python -m labs.quantization.speed", "Time decode-size GEMMs of Llama-8B projections: bf16, "
                     "fp8 W8A8 (torch._scaled_mm) and weight-only int8/int4 (Triton).", EXPERIMENTS, RESULTS_PATH)
    args = p.parse_args(argv)
    bench.validate(p, args)
    import torch

    from labs.gpu_harness.environment import NoGpuError, environment
    from labs.gpu_harness.timing import event_timer

    try:
        env = environment(torch)
    except NoGpuError as e:
        return bench.fail(str(e))
    print("environment: " + ", ".join(f"{k} {v}" for k, v in env.items()))
    rows, wrong = run(torch, event_timer(torch, reps=args.reps))
    if wrong:
        return bench.fail("wrong results, nothing recorded:\n  " + "\n  ".join(wrong))
    from labs.quantization import speed as this

    bench.finish(LAB, env, {"reps": args.reps}, {"gemm": rows}, this, args.out, args.record, RESULTS_PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main())
