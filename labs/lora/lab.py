"""The multi-LoRA lab's cases and rows: overhead of the adapters over the base layer, loop vs segmented.

Each case is one projection of Llama-3.1-8B (shapes from labs/data/models.yaml through the
cost model), a batch of `tokens` rows spread evenly over `adapters` distinct adapters of one
rank, every row using one, in shuffled order so that grouping has work to do. Three things
are timed (CUDA events, L2 flushed, median): the base layer alone (torch's bf16 linear),
the per-adapter loop and the two segmented kernels, both adding into the base output. Each
is timed twice: launched from Python (eager), and replayed from a CUDA graph, as vLLM 0.33
runs decode-sized batches, which removes the CPU's launch cost and leaves the GPU's work.
Overhead is the LoRA time over the base time, eager against eager and graph against graph. Before timing, both LoRA paths are checked
against the fp32 merged-weight reference; a mismatch stops the run before anything is written.

The cost model (labs/roofline.py gemm and lora_op) gives the floors beside each measurement,
so the page can say how far each path is from the bytes it must read. Everything here but
`run` is plain Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs import roofline

EXPERIMENTS = ("adapters", "ranks")
MODEL = "llama-3.1-8b"
GPU = "h200"  # whose datasheet rates the floors use
LAYERS = ("q_proj", "gate_proj")  # q_proj has o_proj's shape transposed: 4,096 x 4,096 both
TOKENS = (16, 64, 256, 2048)
ADAPTER_COUNTS = (1, 2, 4, 8, 16, 32)  # at rank 16
RANKS = (8, 16, 32, 64)  # at 8 adapters
SWEEP_RANK, SWEEP_ADAPTERS = 16, 8
SCALE = 2.0  # alpha / r of a typical adapter (alpha = 2r)
MATCH_REL_ERR = 2e-2  # ||ours - ref|| / ||ref delta||: bf16 rounding of the output and of the r-wide term


@dataclass(frozen=True)
class Case:
    experiment: str
    layer: str
    tokens: int
    adapters: int
    rank: int

    @property
    def name(self) -> str:
        return f"{self.layer}-T{self.tokens}-n{self.adapters}-r{self.rank}"


def cases(experiments: tuple[str, ...] = EXPERIMENTS) -> list[Case]:
    out = []
    for layer in LAYERS:
        for t in TOKENS:
            if "adapters" in experiments:
                out += [Case("adapters", layer, t, n, SWEEP_RANK) for n in ADAPTER_COUNTS if n <= t]
            if "ranks" in experiments:
                out += [Case("ranks", layer, t, SWEEP_ADAPTERS, r) for r in RANKS]
    return out


def shape(layer: str) -> tuple[int, int]:
    """(in, out) of one projection of the lab's model."""
    n_in, n_out, _ = roofline.lora_projections(MODEL)[layer]
    return n_in, n_out


def floors(case: Case) -> dict:
    """The cost model's floors for the base GEMM and the LoRA term, and the bytes each must read."""
    n_in, n_out = shape(case.layer)
    base = roofline.gemm(GPU, case.tokens, n_out, n_in)
    lora = roofline.lora_op(GPU, case.tokens, n_in, n_out, case.rank, case.adapters)
    return {"base_floor_us": round(base.floor_s * 1e6, 2), "lora_floor_us": round(lora.floor_s * 1e6, 2),
            "floor_overhead": round(lora.floor_s / base.floor_s, 4),
            "base_weight_bytes": 2 * n_in * n_out, "adapter_bytes": 2 * case.rank * (n_in + n_out)}


def row(case: Case, eager: dict, graph: dict, loop_err: float, seg_err: float) -> dict:
    """eager and graph: {"base", "loop", "segmented"} -> median µs (graph values None when capture failed)."""
    n_in, n_out = shape(case.layer)
    r = {"layer": case.layer, "n_in": n_in, "n_out": n_out, "tokens": case.tokens, "adapters": case.adapters,
         "rank": case.rank}
    for mode, times in (("", eager), ("graph_", graph)):
        for path in ("base", "loop", "segmented"):
            t = times.get(path)
            r[f"{mode}{path}_us"] = None if t is None else round(t, 2)
        for path in ("loop", "segmented"):
            ok = times.get(path) is not None and times.get("base") is not None
            r[f"{mode}{path}_overhead"] = round(times[path] / times["base"], 4) if ok else None
        ok = times.get("loop") is not None and times.get("segmented") is not None
        r[f"{mode}loop_over_segmented"] = round(times["loop"] / times["segmented"], 2) if ok else None
    return {**r, "loop_rel_err": float(f"{loop_err:.3g}"), "segmented_rel_err": float(f"{seg_err:.3g}"),
            **floors(case)}


def config_name(experiment: str, r: dict) -> str:
    return f"{r['layer']}-T{r['tokens']}-n{r['adapters']}-r{r['rank']}"


HEADER = (f"{'layer':<10} {'T':>5} {'n':>3} {'r':>3} {'base us':>8} {'loop us':>8} {'seg us':>8} "
          f"{'loop ovh':>9} {'seg ovh':>8} | {'graph: base':>11} {'loop':>7} {'seg':>7} {'loop ovh':>9} "
          f"{'seg ovh':>8} | {'floor ovh':>9}")


def _pct(v) -> str:
    return "-" if v is None else f"{v:.0%}"


def _us(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def format_row(experiment: str, r: dict) -> str:
    return (f"{r['layer']:<10} {r['tokens']:>5} {r['adapters']:>3} {r['rank']:>3} {_us(r['base_us']):>8} "
            f"{_us(r['loop_us']):>8} {_us(r['segmented_us']):>8} {_pct(r['loop_overhead']):>9} "
            f"{_pct(r['segmented_overhead']):>8} | {_us(r['graph_base_us']):>11} {_us(r['graph_loop_us']):>7} "
            f"{_us(r['graph_segmented_us']):>7} {_pct(r['graph_loop_overhead']):>9} "
            f"{_pct(r['graph_segmented_overhead']):>8} | {_pct(r['floor_overhead']):>9}")


def printed(sections: dict) -> dict[str, str]:
    return {name: "\n".join([HEADER, *(format_row(name, r) for r in rows)]) for name, rows in sections.items()}


def _graphed(torch, fn):
    """fn captured in a CUDA graph (after a warm-up call on a side stream); returns the replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _inputs(torch, case: Case, seed: int):
    """Base weight, input, adapter slots and one slot per row (evenly spread, shuffled)."""
    n_in, n_out = shape(case.layer)
    g = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*size, std):
        return (torch.randn(size, device="cuda", generator=g) * std).to(torch.bfloat16)

    w = randn(n_out, n_in, std=0.02)
    x = randn(case.tokens, n_in, std=1.0)
    a = randn(case.adapters, case.rank, n_in, std=n_in ** -0.5)
    b = randn(case.adapters, n_out, case.rank, std=case.rank ** -0.5)
    ids = torch.arange(case.tokens, device="cuda", dtype=torch.int32) % case.adapters
    ids = ids[torch.randperm(case.tokens, device="cuda", generator=g)]
    return w, x, a, b, ids


def _one_case(torch, case: Case, time, seed: int) -> dict:
    import torch.nn.functional as F

    from labs.lora import kernels

    w, x, a, b, ids = _inputs(torch, case, seed)
    p = kernels.plan(torch, ids)
    base = F.linear(x, w)
    ref = kernels.lora_reference(torch, x, base, a, b, ids, SCALE)
    delta = (ref - base.float()).norm()
    errs = {}
    for name, fn in (("loop", kernels.lora_loop), ("segmented", kernels.lora_segmented)):
        out = fn(torch, x, base.clone(), a, b, p, SCALE)
        errs[name] = ((out.float() - ref).norm() / delta).item()
        assert errs[name] <= MATCH_REL_ERR, (f"{case.name}: {name} differs from the fp32 reference "
                                             f"(relative error {errs[name]:.3g} > {MATCH_REL_ERR})")
    y = base.clone()
    fns = {"base": lambda: F.linear(x, w), "loop": lambda: kernels.lora_loop(torch, x, y, a, b, p, SCALE),
           "segmented": lambda: kernels.lora_segmented(torch, x, y, a, b, p, SCALE)}
    eager = {name: time(fn).median_us for name, fn in fns.items()}
    graph = {}
    for name, fn in fns.items():
        try:
            graph[name] = time(_graphed(torch, fn)).median_us
        except Exception as e:  # capture is not possible here: the eager rows still stand
            print(f"{case.name}: {name} not captured in a CUDA graph ({type(e).__name__}: {str(e)[:120]})")
            graph[name] = None
    return row(case, eager, graph, errs["loop"], errs["segmented"])


def run(torch, time, reps: int, experiments: tuple[str, ...], log=print) -> tuple[dict, list[dict]]:
    """Check and time every case; returns ({experiment: rows}, failed cases)."""
    sections, failed = {}, []
    log(HEADER)
    for i, case in enumerate(cases(experiments)):
        try:
            r = _one_case(torch, case, time, seed=1000 + i)
        except AssertionError:
            raise
        except Exception as e:  # cannot run here (out of memory, a Triton limit): reported, the rest recorded
            failed.append({"experiment": case.experiment, "variant": case.name,
                           "error": f"{type(e).__name__}: {e}"[:300]})
            log(f"{case.name:<34} failed: {type(e).__name__}: {e}"[:200])
            torch.cuda.empty_cache()
            continue
        log(format_row(case.experiment, r))
        sections.setdefault(case.experiment, []).append(r)
    return sections, failed
