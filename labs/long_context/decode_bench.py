"""Decode attention time against context, with the project's paged kernel, at Llama-3.1-8B shapes.

    python -m labs.long_context.decode_bench --out out/long_context            # rows printed and written
    python -m labs.long_context.decode_bench --out out/long_context --record   # ... and stored in labs/results/

One decode step of one layer: B sequences of L cached tokens each, one query token each,
H_q = 32, H_kv = 8, d = 128, 16-token blocks in random physical order
(labs.paged_attention.workload.make_problem), L from 4,096 to 131,072, B = 1 and 8, the cache
in bf16 and in fp8 e4m3 with per-tensor scales. Each row has the time, the KV bytes read,
the bandwidth that implies and its fraction of the copy bandwidth measured in the same run,
the cost model's KV-read floor for the same bytes (datasheet bandwidth), and the attention
time of a whole decode step (x n_layers). Where the fp32 reference is cheap (B x L <= 65,536)
the output is checked against it first; a mismatch stops the run before anything is written.
Everything but `run` is plain Python: the CPU tests feed it fake timings.
"""

from __future__ import annotations

import sys

from labs import roofline
from labs.gpu_harness import lab_main
from labs.gpu_harness.results import RESULTS_DIR

LAB = "long_context"
RESULTS_PATH = RESULTS_DIR / f"{LAB}.json"
EXPERIMENTS = ("decode",)
MODEL = "llama-3.1-8b"
GPU = "h200"
CONTEXTS = tuple(4096 * 2**i for i in range(6))  # 4K .. 128K
BATCHES = (1, 8)
KV_DTYPES = ("bf16", "fp8")
BLOCK_SIZE = 16  # vLLM 0.33's default block for this model
CHECK_TOKENS = 65536  # B x L up to this: the fp32 reference is checked (it gathers the cache in fp32)
MATCH_REL_ERR = {"bf16": 2e-2, "fp8": 2e-2}  # against the fp32 reference on what the cache holds
KV_BYTES = {"bf16": 2, "fp8": 1}
COST_KV_DTYPE = {"bf16": "auto", "fp8": "fp8"}


def shapes() -> tuple[int, int, int, int]:
    """(H_q, H_kv, d, n_layers) of the model, from labs/data/models.yaml."""
    m = roofline.get_model(MODEL)
    return m.n_heads, m.n_kv_heads, m.head_dim, m.n_layers


def decode_row(kv: str, batch: int, context: int, time_us: float, copy_gb_s: float, rel_err: float | None) -> dict:
    """One measured layer: bytes read, implied TB/s, fraction of copy, and the cost model's floor for those bytes."""
    h_q, h_kv, d, n_layers = shapes()
    kv_bytes = 2 * batch * context * h_kv * d * KV_BYTES[kv]
    dep = roofline.deployment(MODEL, GPU, kv_dtype=COST_KV_DTYPE[kv])
    model_us = roofline.decode(dep, batch, context).kv_read_s / n_layers * 1e6
    tb_s = kv_bytes / time_us / 1e6
    return {"kv": kv, "batch": batch, "context": context, "time_us": round(time_us, 2), "kv_bytes": kv_bytes,
            "tb_s": round(tb_s, 3), "of_copy": round(tb_s * 1e3 / copy_gb_s, 3),
            "model_us": round(model_us, 2), "of_model": round(model_us / time_us, 3),
            "step_attention_ms": round(time_us * n_layers / 1e3, 3),
            "rel_err": None if rel_err is None else float(f"{rel_err:.3g}")}


HEADER = (f"{'kv':<4} {'B':>2} {'L':>7} {'time us':>9} {'KV MiB':>8} {'TB/s':>6} {'of copy':>7} {'model us':>9} "
          f"{'step ms':>8}")


def format_row(r: dict) -> str:
    return (f"{r['kv']:<4} {r['batch']:>2} {r['context']:>7} {r['time_us']:>9.1f} {r['kv_bytes'] / 2**20:>8.0f} "
            f"{r['tb_s']:>6.2f} {r['of_copy']:>7.2f} {r['model_us']:>9.1f} {r['step_attention_ms']:>8.2f}")


def config_name(experiment: str, r: dict) -> str:
    return f"{r['kv']}-b{r['batch']}-l{r['context']}"


def printed(sections: dict) -> dict[str, str]:
    rows = sections.get("decode") or []
    return {"decode": "\n".join([HEADER, *map(format_row, rows)])} if rows else {}


# ---------------------------------------------------------------------------
# On the GPU
# ---------------------------------------------------------------------------


def _case(torch, kv: str, batch: int, context: int, time, copy_gb_s: float, device: str = "cuda") -> dict:
    from labs.paged_attention.kernel import paged_decode
    from labs.paged_attention.reference import paged_decode_ref
    from labs.paged_attention.workload import make_problem

    h_q, h_kv, d, _ = shapes()
    q_dtype = torch.bfloat16 if device == "cuda" else torch.float16  # the interpreter has no bf16 arithmetic
    kv_dtype = torch.float8_e4m3fn if kv == "fp8" else q_dtype
    p = make_problem([context] * batch, h_q, h_kv, d, BLOCK_SIZE, q_dtype, device, spare_blocks=1,
                     seed=batch * 7 + context, kv_dtype=kv_dtype)
    args = (p.q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens)
    kw = {**p.kernel_kwargs(), "max_seq_len": p.max_seq_len}
    out = paged_decode(*args, **kw)
    err = None
    if batch * context <= CHECK_TOKENS:
        ref = paged_decode_ref(*args, k_scale=p.k_scale, v_scale=p.v_scale)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        if not err <= MATCH_REL_ERR[kv]:
            raise AssertionError(f"paged decode {kv} B={batch} L={context}: relative error {err:.3g} "
                                 f"against the fp32 reference exceeds {MATCH_REL_ERR[kv]}")
    row = decode_row(kv, batch, context, time(lambda: paged_decode(*args, **kw)).median_us, copy_gb_s, err)
    del p, args, out
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def run(torch, time, copy_gb_s: float, reps: int, experiments: tuple[str, ...], log=print,
        contexts=CONTEXTS, batches=BATCHES, kv_dtypes=KV_DTYPES, device: str = "cuda") -> tuple[dict, list[dict]]:
    rows, failed = [], []
    log(HEADER)
    for kv in kv_dtypes:
        for batch in batches:
            for context in contexts:
                try:
                    r = _case(torch, kv, batch, context, time, copy_gb_s, device)
                except AssertionError:
                    raise
                except Exception as e:  # reported; the other shapes are recorded
                    failed.append({"experiment": "decode", "variant": f"{kv}-b{batch}-l{context}",
                                   "error": f"{type(e).__name__}: {e}"[:300]})
                    log(f"{kv} B={batch} L={context} failed: {type(e).__name__}: {e}"[:200])
                    if device == "cuda":
                        torch.cuda.empty_cache()
                    continue
                log(format_row(r))
                rows.append(r)
    return ({"decode": rows} if rows else {}), failed


_measure = lab_main.variants(lambda gpu, experiments: run(gpu.torch, gpu.time, gpu.copy_gb_s, gpu.reps, experiments))


def main(argv: list[str] | None = None) -> int:
    return lab_main.main(argv, prog="python -m labs.long_context.decode_bench", lab=LAB,
                         lab_module=sys.modules[__name__], results_path=RESULTS_PATH, reps=10, measure=_measure,
                         description="Time one layer's decode attention with the project's paged kernel at "
                         "Llama-3.1-8B shapes for L = 4K to 128K, B = 1 and 8, bf16 and fp8 KV.")


if __name__ == "__main__":
    sys.exit(main())
