"""The roofline lab: GEMM throughput against M, and decode attention's intensity, measured.

GEMM: Y = X W with W one Llama-3.1-8B layer's gate/up projection (K = hidden_size,
N = 2 x intermediate_size), X of M rows (M = tokens in the batch), M = 1 to 8,192, in
bf16 (torch.matmul) and fp8 e4m3 (torch._scaled_mm, per-tensor scales, bf16 out). The
cost model (labs/roofline.py gemm) gives each point's FLOPs, bytes and intensity; the
measurement gives its time. The measured ridge is where the two measured roofs meet:
the highest TFLOP/s of the sweep over the highest GB/s of its memory-bound rows.

Decode attention: the project's paged kernel (labs.paged_attention.kernel.paged_decode)
over B sequences of L cached tokens each: FLOPs 4 H_q d per (query, key) pair, bytes
the K and V it reads; the intensity is 2 H_q / (H_kv b) whatever B and L.
Everything here but `run` is plain Python: the CPU tests feed it fake timings.
"""

from __future__ import annotations

from labs import roofline

EXPERIMENTS = ("gemm", "attention")
MODEL = "llama-3.1-8b"
GPU = "h200"
M_VALUES = tuple(2**i for i in range(14))  # 1 .. 8,192
GEMM_DTYPES = ("bf16", "fp8")
ATTN_BATCHES = (1, 16, 64)
ATTN_CONTEXTS = (1024, 4096, 16384)
BLOCK_SIZE = 16  # tokens per KV block, vLLM 0.33's default for this model
MEMORY_BOUND_M = 16  # rows up to this M measure the bandwidth roof
MATCH_REL_ERR = {"bf16": 1e-2, "fp8": 6e-2}  # against an fp32 product of the same (rounded) inputs


def gemm_shape() -> tuple[int, int]:
    """(N, K) of the gate/up projection: 2 x intermediate_size outputs, hidden_size inputs."""
    from labs.specs import get_model

    m = get_model(MODEL)
    return 2 * m.intermediate_size, m.hidden_size


def gemm_row(dtype: str, m: int, n: int, k: int, time_us: float, rel_err: float) -> dict:
    c = roofline.gemm(GPU, m, n, k, dtype)
    return {"dtype": dtype, "m": m, "n": n, "k": k, "time_us": round(time_us, 2),
            "tflop_s": round(c.flops / time_us / 1e6, 1), "gb_s": round(c.bytes / time_us / 1e3, 1),
            "intensity": round(c.intensity, 2), "model_us": round(c.floor_s * 1e6, 2), "model_bound": c.bound,
            "of_model": round(c.floor_s * 1e6 / time_us, 3), "rel_err": float(f"{rel_err:.3g}")}


def ridges(rows: list[dict]) -> list[dict]:
    """Per dtype: measured peak, measured bandwidth, the measured ridge M and the cost model's."""
    out = []
    for dtype in GEMM_DTYPES:
        rs = [r for r in rows if r["dtype"] == dtype]
        small = [r for r in rs if r["m"] <= MEMORY_BOUND_M]
        if not rs or not small:
            continue
        n, k = rs[0]["n"], rs[0]["k"]
        peak = max(r["tflop_s"] for r in rs)
        bw = max(r["gb_s"] for r in small) / 1e3
        g = roofline.get_gpu(GPU)
        out.append({"dtype": dtype, "n": n, "k": k, "peak_tflop_s": peak, "bandwidth_tb_s": round(bw, 3),
                    "ridge_flop_per_byte": round(peak / bw, 1),
                    "ridge_m": round(roofline.gemm_ridge_m(GPU, n, k, dtype, tflops=peak, tb_s=bw), 1),
                    "model_peak_tflop_s": g.dense_tflops[dtype], "model_tb_s": g.hbm_bandwidth_tbps,
                    "model_ridge_m": round(roofline.gemm_ridge_m(GPU, n, k, dtype), 1),
                    "of_peak": round(peak / g.dense_tflops[dtype], 3)})
    return out


def attention_row(batch: int, context: int, heads: int, kv_heads: int, head_dim: int, time_us: float,
                  rel_err: float | None) -> dict:
    """One paged decode: FLOPs 4 H_q d per pair, bytes = K and V read (bf16) plus q and out."""
    flops = 4.0 * batch * heads * head_dim * context
    kv = 2.0 * batch * context * kv_heads * head_dim * 2
    nbytes = kv + 2.0 * batch * heads * head_dim * 2
    return {"batch": batch, "context": context, "time_us": round(time_us, 2), "kv_bytes": kv, "flops": flops,
            "intensity": round(flops / nbytes, 3), "tflop_s": round(flops / time_us / 1e6, 2),
            "tb_s": round(nbytes / time_us / 1e6, 3),
            "rel_err": None if rel_err is None else float(f"{rel_err:.3g}")}


GEMM_HEADER = (f"{'dtype':<5} {'M':>5} {'N':>6} {'K':>5} {'time us':>9} {'TFLOP/s':>8} {'GB/s':>8} {'FLOP/B':>8} "
               f"{'model us':>9} {'of model':>8}")


def format_gemm(r: dict) -> str:
    return (f"{r['dtype']:<5} {r['m']:>5} {r['n']:>6} {r['k']:>5} {r['time_us']:>9.1f} {r['tflop_s']:>8.1f} "
            f"{r['gb_s']:>8.0f} {r['intensity']:>8.1f} {r['model_us']:>9.1f} {r['of_model']:>8.3f}")


RIDGE_HEADER = f"{'dtype':<5} {'peak TF/s':>9} {'TB/s':>6} {'ridge FLOP/B':>12} {'ridge M':>8} {'model M':>8}"


def format_ridge(r: dict) -> str:
    return (f"{r['dtype']:<5} {r['peak_tflop_s']:>9.1f} {r['bandwidth_tb_s']:>6.2f} {r['ridge_flop_per_byte']:>12.1f} "
            f"{r['ridge_m']:>8.1f} {r['model_ridge_m']:>8.1f}")


ATTN_HEADER = f"{'B':>3} {'L':>6} {'time us':>9} {'FLOP/B':>7} {'TFLOP/s':>8} {'TB/s':>6}"


def format_attention(r: dict) -> str:
    return (f"{r['batch']:>3} {r['context']:>6} {r['time_us']:>9.1f} {r['intensity']:>7.2f} {r['tflop_s']:>8.2f} "
            f"{r['tb_s']:>6.2f}")


def config_name(experiment: str, r: dict) -> str:
    if experiment == "gemm":
        return f"{r['dtype']}-m{r['m']}"
    if experiment == "ridge":
        return r["dtype"]
    return f"b{r['batch']}-l{r['context']}"


def printed(sections: dict) -> dict[str, str]:
    out = {}
    for name, header, fmt in (("gemm", GEMM_HEADER, format_gemm), ("ridge", RIDGE_HEADER, format_ridge),
                              ("attention", ATTN_HEADER, format_attention)):
        if sections.get(name):
            out[name] = "\n".join([header, *map(fmt, sections[name])])
    return out


# ---------------------------------------------------------------------------
# On the GPU
# ---------------------------------------------------------------------------


def _rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _gemm_fn(torch, dtype: str, x, w):
    """The product to time, and its inputs as the fp32 reference sees them."""
    if dtype == "bf16":
        return (lambda: torch.matmul(x, w)), x.float(), w.float()
    x8, w8 = x.to(torch.float8_e4m3fn), w.t().contiguous().to(torch.float8_e4m3fn).t()  # W column-major
    one = torch.ones((), device="cuda", dtype=torch.float32)
    return (lambda: torch._scaled_mm(x8, w8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)), x8.float(), w8.float()


def run_gemm(torch, time, log=print) -> tuple[list[dict], list[dict]]:
    n, k = gemm_shape()
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g) * k**-0.5
    x_all = torch.randn(max(M_VALUES), k, device="cuda", dtype=torch.bfloat16, generator=g)
    rows, failed = [], []
    log(GEMM_HEADER)
    for dtype in GEMM_DTYPES:
        for m in M_VALUES:
            x = x_all[:m]
            try:
                fn, xr, wr = _gemm_fn(torch, dtype, x, w)
                err = _rel_err(fn(), xr @ wr)
            except Exception as e:  # fp8 unsupported here: reported, bf16 still recorded
                failed.append({"experiment": "gemm", "variant": f"{dtype}-m{m}", "error": f"{type(e).__name__}: {e}"[:300]})
                log(f"{dtype:<5} {m:>5} failed: {type(e).__name__}: {e}"[:200])
                continue
            if not err <= MATCH_REL_ERR[dtype]:
                raise AssertionError(f"{dtype} GEMM at M = {m}: relative error {err:.3g} against fp32 "
                                     f"exceeds {MATCH_REL_ERR[dtype]}")
            r = gemm_row(dtype, m, n, k, time(fn).median_us, err)
            log(format_gemm(r))
            rows.append(r)
    return rows, failed


def _attention_case(torch, paged_decode, paged_decode_ref, make_problem, md, b: int, ctx: int, time) -> dict:
    """Build B sequences of ctx cached tokens, check the kernel where the reference is cheap, time it."""
    p = make_problem([ctx] * b, md.n_heads, md.n_kv_heads, md.head_dim, BLOCK_SIZE, torch.bfloat16, "cuda",
                     spare_blocks=1, seed=b * 7 + ctx)
    args = (p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens)
    out = paged_decode(*args)
    err = None  # not checked: the fp32 reference would gather gigabytes
    if b * ctx <= 16 * 4096:  # the reference gathers the cache in fp32: check where that is cheap
        err = _rel_err(out, paged_decode_ref(*args))
        if not err <= 2e-2:
            raise AssertionError(f"paged decode B={b} L={ctx}: relative error {err:.3g} against the reference")
    return attention_row(b, ctx, md.n_heads, md.n_kv_heads, md.head_dim, time(lambda: paged_decode(*args)).median_us,
                         err)


def run_attention(torch, time, log=print) -> tuple[list[dict], list[dict]]:
    from labs.paged_attention.kernel import paged_decode
    from labs.paged_attention.reference import paged_decode_ref
    from labs.specs import get_model

    md = get_model(MODEL)
    rows, failed = [], []
    log(ATTN_HEADER)
    from labs.paged_attention.workload import make_problem

    for b in ATTN_BATCHES:
        for ctx in ATTN_CONTEXTS:
            try:
                r = _attention_case(torch, paged_decode, paged_decode_ref, make_problem, md, b, ctx, time)
            except AssertionError:
                raise
            except Exception as e:  # reported; the other shapes are recorded
                failed.append({"experiment": "attention", "variant": f"b{b}-l{ctx}",
                               "error": f"{type(e).__name__}: {e}"[:300]})
                log(f"B={b} L={ctx} failed: {type(e).__name__}: {e}"[:200])
                torch.cuda.empty_cache()
                continue
            log(format_attention(r))
            rows.append(r)
    return rows, failed


def run(torch, time, experiments: tuple[str, ...], log=print) -> tuple[dict, list[dict]]:
    sections, failed = {}, []
    if "gemm" in experiments:
        rows, failed = run_gemm(torch, time, log)
        sections["gemm"] = rows
        sections["ridge"] = ridges(rows)
        log(RIDGE_HEADER)
        for r in sections["ridge"]:
            log(format_ridge(r))
    if "attention" in experiments:
        try:
            rows, f = run_attention(torch, time, log)
        except AssertionError:
            raise
        except Exception as e:
            rows, f = [], [{"experiment": "attention", "variant": "paged-decode", "error": f"{type(e).__name__}: {e}"[:300]}]
            log(f"attention failed: {type(e).__name__}: {e}")
        sections["attention"], failed = rows, failed + f
    return {k: v for k, v in sections.items() if v}, failed
