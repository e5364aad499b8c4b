"""The FlashAttention lab: naive attention, our Triton kernel and torch SDPA over sequence lengths.

Every case is one attention forward with Llama-3.1-8B's heads (32 query heads, 8 KV
heads, d = 128, bf16). FLOPs and HBM bytes come from the cost model
(labs/roofline.py attention_forward): the FLOPs are the same for all three, the bytes
are not. Time is measured (CUDA events, L2 flushed, median). Each case is checked
against SDPA before it is timed; a mismatch exits before anything is written.
Everything here but `run` is plain Python: the CPU tests feed it fake timings.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs import roofline

EXPERIMENTS = ("prefill", "decode")
MODEL = "llama-3.1-8b"
GPU = "h200"  # whose datasheet rates the cost model's floors use
MATCH_REL_ERR = 2e-2  # bf16 outputs against SDPA's, ||ours - sdpa|| / ||sdpa||


@dataclass(frozen=True)
class Case:
    experiment: str  # "prefill" (q_len = kv_len) or "decode" (q_len = 1)
    batch: int
    q_len: int
    kv_len: int
    causal: bool

    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "full"
        return f"{self.experiment}-b{self.batch}-q{self.q_len}-kv{self.kv_len}-{mask}"


CASES = [
    *(Case("prefill", 1, n, n, causal) for causal in (False, True) for n in (256, 1024, 4096, 16384)),
    *(Case("decode", b, 1, kv, True) for b, kv in ((1, 4096), (32, 4096), (32, 16384))),
]


def costs(case: Case, heads: int, kv_heads: int, head_dim: int, block_m: int) -> dict:
    """FLOPs and the three byte counts (naive, flash upper bound, flash compulsory) of one case."""
    args = (GPU, case.batch, heads, kv_heads, case.q_len, case.kv_len, head_dim, case.causal)
    naive = roofline.attention_forward(*args, io="naive")
    flash = roofline.attention_forward(*args, io="flash", block_m=block_m)
    least = roofline.attention_forward(*args, io="flash_min")
    return {"flops": naive.flops, "naive_bytes": naive.bytes, "flash_bytes": flash.bytes,
            "min_bytes": least.bytes}


def row(case: Case, c: dict, naive_us: float | None, flash_us: float, sdpa_us: float, err: float) -> dict:
    r = {"case": case.name, "batch": case.batch, "q_len": case.q_len, "kv_len": case.kv_len, "causal": case.causal,
         **c, "flash_us": round(flash_us, 1), "sdpa_us": round(sdpa_us, 1),
         "naive_us": None if naive_us is None else round(naive_us, 1),
         "flash_tflop_s": round(c["flops"] / flash_us / 1e6, 1), "sdpa_tflop_s": round(c["flops"] / sdpa_us / 1e6, 1),
         "rel_err": float(f"{err:.3g}")}
    r["bytes_ratio"] = round(c["naive_bytes"] / c["min_bytes"], 1)
    if naive_us is not None:
        r["naive_tflop_s"] = round(c["flops"] / naive_us / 1e6, 1)
        r["naive_gb_s"] = round(c["naive_bytes"] / naive_us / 1e3, 1)
        r["naive_vs_flash"] = round(naive_us / flash_us, 2)
    return r


HEADER = (f"{'case':<34} {'GFLOP':>8} {'naive MB':>9} {'flash MB':>9} {'naive us':>9} {'flash us':>9} "
          f"{'sdpa us':>8} {'naive/fl':>8} {'flash TF/s':>10}")


def format_row(r: dict) -> str:
    naive = "—" if r["naive_us"] is None else f"{r['naive_us']:.1f}"
    ratio = "—" if r.get("naive_vs_flash") is None else f"{r['naive_vs_flash']:.2f}"
    return (f"{r['case']:<34} {r['flops'] / 1e9:>8.1f} {r['naive_bytes'] / 1e6:>9.1f} {r['min_bytes'] / 1e6:>9.1f} "
            f"{naive:>9} {r['flash_us']:>9.1f} {r['sdpa_us']:>8.1f} {ratio:>8} {r['flash_tflop_s']:>10.1f}")


def config_name(experiment: str, r: dict) -> str:
    return r["case"]


def printed(sections: dict) -> dict[str, str]:
    rows = [r for name in EXPERIMENTS for r in sections.get(name, [])]
    return {"all": "\n".join([HEADER, *map(format_row, rows)])}


def _rel_err(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _one_case(torch, F, case, m, time, failed, flash_attention, naive_attention, causal_drop) -> dict:
    """Check one case against SDPA, then time naive (unless out of memory), ours and SDPA."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(case.batch, m.n_heads, case.q_len, m.head_dim, device="cuda", dtype=torch.bfloat16,
                    generator=g)
    k, v = (torch.randn(case.batch, m.n_kv_heads, case.kv_len, m.head_dim, device="cuda", dtype=torch.bfloat16,
                        generator=g) for _ in range(2))
    block_m = 16 if case.q_len <= 16 else 128

    def sdpa():
        # q_len = 1 with is_causal would align top-left in SDPA; one query sees every key anyway
        return F.scaled_dot_product_attention(q, k, v, is_causal=case.causal and case.q_len > 1, enable_gqa=True)

    ref = sdpa()
    out = flash_attention(q, k, v, causal=case.causal)
    err = _rel_err(out, ref)
    if not err <= MATCH_REL_ERR:
        raise AssertionError(f"{case.name}: our kernel differs from SDPA by {err:.3g} (bound {MATCH_REL_ERR})")
    naive_us = None
    try:
        drop = causal_drop(case.q_len, case.kv_len, m.n_heads // m.n_kv_heads, "cuda") if case.causal else None
        nout = naive_attention(q, k, v, case.causal, drop)
        nerr = _rel_err(nout, ref)
        del nout
        if not nerr <= MATCH_REL_ERR:
            raise AssertionError(f"{case.name}: naive attention differs from SDPA by {nerr:.3g}")
        naive_us = time(lambda: naive_attention(q, k, v, case.causal, drop)).median_us
        del drop
    except torch.cuda.OutOfMemoryError as e:  # S does not fit: the row says so, the others run
        failed.append({"experiment": case.experiment, "variant": f"{case.name}-naive", "error": str(e)[:200]})
        torch.cuda.empty_cache()
    flash_us = time(lambda: flash_attention(q, k, v, causal=case.causal)).median_us
    sdpa_us = time(sdpa).median_us
    r = row(case, costs(case, m.n_heads, m.n_kv_heads, m.head_dim, block_m), naive_us, flash_us, sdpa_us, err)
    return r


def run(torch, time, reps: int, experiments: tuple[str, ...], log=print) -> tuple[dict, list[dict]]:
    """Check and time every case of `experiments`; returns ({experiment: rows}, failed variants)."""
    import torch.nn.functional as F

    from labs.flash_attention.kernel import causal_drop, flash_attention, naive_attention
    from labs.specs import get_model

    m = get_model(MODEL)
    sections, failed = {}, []
    log(HEADER)
    for case in CASES:
        if case.experiment not in experiments:
            continue
        try:
            r = _one_case(torch, F, case, m, time, failed, flash_attention, naive_attention, causal_drop)
        except AssertionError:
            raise
        except Exception as e:  # this case cannot run here: reported, the other cases recorded
            failed.append({"experiment": case.experiment, "variant": case.name,
                           "error": f"{type(e).__name__}: {e}"[:300]})
            log(f"{case.name:<34} failed: {type(e).__name__}: {e}"[:200])
            torch.cuda.empty_cache()
            continue
        log(format_row(r))
        sections.setdefault(case.experiment, []).append(r)
    return sections, failed
