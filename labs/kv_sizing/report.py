"""The KV-sizing lab as Markdown for the site: budgets, the calculator's own text, the GPU check.

Pages must not retype a number the lab computes, so every table here is built
from `budget(...)` (or from labs/results/kv_alloc_check.json, which
`python -m labs.kv_sizing.check --record` writes on a GPU) at build time. No
torch: the site build imports this module.

macros.py registers every function in `MACROS` as a page macro under its own
name, so the names carry a `kv_` prefix to stay unique across the site.
"""

from __future__ import annotations

import contextlib
import io
import shlex
from pathlib import Path

from labs import recorded, specs
from labs.kv_sizing import formula
from labs.kv_sizing.memory_budget import GIB, Budget, budget

CHECK_RESULT = recorded.RESULTS_DIR / "kv_alloc_check.json"
CHECK_COMMAND = "python -m labs.kv_sizing.check --out /tmp/kv-check --record"
TP_CHOICES = (1, 2, 4, 8)

# Knob changes the concurrency table tries, one at a time, then the two that move it most together.
# Values are examples of each knob, not recommendations; `max_model_len` is given as a fraction of L.
KNOB_VARIANTS = (
    ("defaults", {}),
    ("`--gpu-memory-utilization 0.95`", {"gpu_memory_utilization": 0.95}),
    ("`--max-model-len` halved", {"max_model_len_factor": 0.5}),
    ("`--kv-cache-dtype fp8`", {"kv_cache_dtype": "fp8"}),
    ("`--max-num-batched-tokens 2048`", {"max_num_batched_tokens": 2048}),
    ("`--max-num-seqs 256`", {"max_num_seqs": 256}),
    ("`--tensor-parallel-size 2`", {"tensor_parallel_size": 2}),
    ("`--kv-cache-dtype fp8 --tensor-parallel-size 2`", {"kv_cache_dtype": "fp8", "tensor_parallel_size": 2}),
)


class ReportError(ValueError):
    """A macro was called with something the lab cannot size; the build fails with this message."""


# ---------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------


def _gib(n: float) -> str:
    return f"{n / GIB:,.2f} GiB"


def _bytes(n: int) -> str:
    """Exact bytes, with a binary-unit reading once the number is too long to read."""
    if abs(n) < 2**20:
        return f"{n:,} B"
    unit = (GIB, "GiB") if abs(n) >= GIB else (2**20, "MiB")
    return f"{n:,} B ({n / unit[0]:,.2f} {unit[1]})"


def _fence(text: str, lang: str = "text") -> str:
    return f"```{lang}\n{text.rstrip()}\n```"


def _model(name: str) -> specs.ModelSpec:
    try:
        return specs.get_model(name)
    except specs.SpecError as err:
        raise ReportError(str(err)) from None


def _gpu(name: str) -> specs.GPUSpec:
    try:
        return specs.get_gpu(name)
    except specs.SpecError as err:
        raise ReportError(str(err)) from None


def _total_basis(gpu: specs.GPUSpec) -> str:
    if gpu.memory_mib_cuda:
        return (f"cudaMemGetInfo total, measured on this project's {gpu.display_name} "
                f"({gpu.memory_mib_cuda:,} MiB; nvidia-smi prints {gpu.memory_mib_reported:,} MiB)")
    return (f"nvidia-smi total ({gpu.memory_mib_reported:,} MiB, as reported in public logs); "
            "cudaMemGetInfo's is a few hundred MiB lower, so this slightly overestimates")


# ---------------------------------------------------------------------------
# Budgets
# ---------------------------------------------------------------------------


def _weights_basis(m: specs.ModelSpec, tp: int) -> str:
    """How the weight row was derived: the cost model's weight_bytes, with the tables at their own width."""
    split = "" if tp == 1 else f" ÷ TP {tp}"
    if m.table_bytes_per_param == m.weight_bytes_per_param:
        return f"derived: {m.params:,} parameters × {m.weight_bytes_per_param} B{split}"
    body = m.params - m.table_params
    return (f"derived: {body:,} parameters × {m.weight_bytes_per_param} B, embedding and LM head "
            f"({m.table_params:,}) × {m.table_bytes_per_param} B{split}")


def kv_budget(model: str, gpu: str, max_model_len: int | None = None, **kwargs) -> Budget:
    """`budget(...)` by model and GPU name, for pages that need one field: `kv_budget(...).max_concurrency`.

    Keyword arguments are `budget`'s (tensor_parallel_size, kv_cache_dtype, ...).
    """
    try:
        return budget(_model(model), _gpu(gpu), max_model_len, **kwargs)
    except specs.SpecError as err:
        raise ReportError(f"kv_budget({model!r}, {gpu!r}): {err}") from None


def kv_budget_table(model: str, gpu: str, max_model_len: int | None = None, **kwargs) -> str:
    """One rank's memory itemised as the calculator prints it, with what each line rests on."""
    b = kv_budget(model, gpu, max_model_len, **kwargs)
    m, g = _model(model), _gpu(gpu)

    def basis(term: str) -> str:
        return "labelled estimate" if term in b.estimates else "given"

    shape = (f"{formula.kv_heads_per_rank(m, b.tensor_parallel_size)} KV heads/rank × {m.head_dim} × "
             f"{formula.kv_itemsize(m, b.kv_cache_dtype)} B × 2 (K, V)" if m.mla is None else
             f"latent {m.mla.kv_lora_rank} + rope {m.mla.qk_rope_head_dim} × "
             f"{formula.kv_itemsize(m, b.kv_cache_dtype)} B, every rank")
    rows = [
        ("Total memory", _gib(b.total_memory), _total_basis(g)),
        (f"× `gpu_memory_utilization` {b.gpu_memory_utilization} = requested", _gib(b.requested_memory),
         "`request_memory`: ceil(total × utilization)"),
        ("− weights", _gib(b.weights), _weights_basis(m, b.tensor_parallel_size)),
        ("− activation peak (profiling pass)", _gib(b.activation_peak),
         f"{basis('activation_peak')}: a pass of {b.max_num_batched_tokens:,} tokens, {b.max_num_seqs:,} sampler rows"),
        ("− non-torch memory", _gib(b.non_torch), basis("non_torch")),
        ("− CUDA graphs", _gib(b.cudagraph), basis("cudagraph")),
        ("**= KV pool**", f"**{_gib(b.kv_pool)}**", "what `Available KV cache memory` would log"),
        ("÷ bytes per block", f"{b.bytes_per_block:,} B",
         f"{b.block_size} tokens × {b.layer_bytes_per_token:,} B × "
         f"{max(gr['slots'] for gr in b.kv_cache_groups)} layers; {shape}"),
        ("= blocks", f"{b.num_blocks:,}", "one of them is the null block, never handed out"),
        (f"blocks one {b.max_model_len:,}-token request needs", f"{b.blocks_per_request:,}",
         f"ceil({b.max_model_len:,} / {b.block_size})" if len(b.kv_cache_groups) == 1 else "summed over KV-cache groups"),
        ("**maximum concurrency**", f"**{b.max_concurrency:,.2f}×**", "blocks ÷ blocks per request"),
        ("GPU KV cache size", f"{b.kv_cache_tokens:,} tokens", "int(concurrency × max_model_len)"),
    ]
    head = (f"{m.display_name} on {'one' if b.tensor_parallel_size == 1 else 'each'} {g.display_name}"
            f"{'' if b.tensor_parallel_size == 1 else f' of {b.tensor_parallel_size} (TP={b.tensor_parallel_size})'}, "
            f"max_model_len {b.max_model_len:,}, KV dtype {b.kv_cache_dtype}, block size {b.block_size} "
            f"(derived by `labs.kv_sizing`, vLLM 0.33 defaults unless stated):")
    lines = [head, "", "| Item | Value | Basis |", "|---|---:|---|"]
    lines += [f"| {a} | {v} | {c} |" for a, v, c in rows]
    if b.error:
        lines += ["", f"vLLM would refuse to start: {b.error}"]
    return "\n".join(lines)


def _smallest_fitting(m: specs.ModelSpec, g: specs.GPUSpec, max_model_len: int, **kwargs) -> Budget | None:
    """The budget at the smallest TP of TP_CHOICES at which one max-length request fits, else None."""
    for tp in TP_CHOICES:
        try:
            b = budget(m, g, max_model_len, tensor_parallel_size=tp, **kwargs)
        except specs.SpecError:  # heads not divisible by this TP
            continue
        if b.error is None:
            return b
    return None


def kv_budget_matrix(models: list[str], gpus: list[str], max_model_len: int, **kwargs) -> str:
    """Maximum concurrency per model (rows) and GPU (columns), each at the smallest TP that fits."""
    gs = [_gpu(n) for n in gpus]
    lines = ["| Model | " + " | ".join(g.display_name for g in gs) + " |", "|---|" + "---:|" * len(gs)]
    for name in models:
        m = _model(name)
        cells = []
        for g in gs:
            b = _smallest_fitting(m, g, max_model_len, **kwargs)
            cells.append(f"no TP ≤ {TP_CHOICES[-1]} fits" if b is None else
                         f"{b.max_concurrency:,.1f}× on {b.tensor_parallel_size} GPU"
                         + ("s" if b.tensor_parallel_size > 1 else ""))
        lines.append(f"| {m.display_name} | " + " | ".join(cells) + " |")
    lines += ["", f"Derived by `labs.kv_sizing.budget`: maximum concurrency of {max_model_len:,}-token requests "
                  f"for the whole deployment, at the smallest tensor-parallel size of {', '.join(map(str, TP_CHOICES))} "
                  "at which vLLM 0.33 would start, with its default flags and the lab's labelled estimates."]
    return "\n".join(lines)


def kv_knobs_table(model: str, gpu: str, max_model_len: int, target: int | None = None) -> str:
    """What each knob does to one deployment's maximum concurrency, one change at a time (derived)."""
    lines = ["| Change | GPUs | KV pool per GPU | Blocks | L | Max concurrency | Running at once |"
             + (f" ≥ {target}? |" if target else ""),
             "|---|---:|---:|---:|---:|---:|---:|" + ("---|" if target else "")]
    for label, knobs in KNOB_VARIANTS:
        kw = dict(knobs)
        length = int(max_model_len * kw.pop("max_model_len_factor", 1))
        b = kv_budget(model, gpu, length, **kw)
        if b.error:
            row = [label, str(b.tensor_parallel_size), _gib(b.kv_pool), f"{b.num_blocks:,}", f"{length:,}",
                   "does not start", "0"]
        else:
            # The scheduler also stops at max_num_seqs, however many blocks are free.
            running = min(int(b.max_concurrency), b.max_num_seqs)
            row = [label, str(b.tensor_parallel_size), _gib(b.kv_pool), f"{b.num_blocks:,}", f"{length:,}",
                   f"{b.max_concurrency:,.2f}×", f"{running:,}"]
        if target:
            row.append("yes" if not b.error and min(int(b.max_concurrency), b.max_num_seqs) >= target else "no")
        lines.append("| " + " | ".join(row) + " |")
    m, g = _model(model), _gpu(gpu)
    lines += ["", f"Derived by `labs.kv_sizing.budget` for {m.display_name} on {g.display_name}: every request at "
                  "its full L (vLLM's worst case). \"Running at once\" is the smaller of the whole-request "
                  "concurrency and `max_num_seqs`."]
    return "\n".join(lines)


def kv_sizing_cli(args: str) -> str:
    """The calculator run in-process with these arguments: the command, then what it prints."""
    from labs.kv_sizing.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(shlex.split(args))
        except SystemExit as exc:  # argparse rejects the arguments
            code = exc.code
    if code not in (0, 1):  # 1: vLLM would refuse to start, which the output explains
        raise ReportError(f"python -m labs.kv_sizing {args} exited {code}: {err.getvalue().strip()}")
    return _fence(f"python -m labs.kv_sizing {args}", "bash") + "\n\n" + _fence(out.getvalue())


# ---------------------------------------------------------------------------
# The GPU allocation check (labs/results/kv_alloc_check.json)
# ---------------------------------------------------------------------------


def _provenance(m: recorded.MachineResults, configs: list[dict]) -> str:
    runs = []
    for c in configs:
        if c["run"] not in runs:
            runs.append(c["run"])
    parts = []
    for run in runs:
        driver, _, smi_total = run.get("driver_and_memory", "").partition(",")
        v = run.get("versions", {})
        parts.append(f"on {run['date']}: driver {driver.strip() or 'unknown'}, nvidia-smi total "
                     f"{smi_total.strip() or 'unknown'}, cudaMemGetInfo total {run['total_memory_mib']:,} MiB; "
                     f"torch {v.get('torch', '?')}, CUDA {v.get('cuda', '?')}")
    modelled = runs[0].get("vllm_version_modelled", "0.33.0") if runs else "0.33.0"
    return (f"Measured on an {m.label} {'; and '.join(parts)}. vLLM itself did not run: the check "
            f"allocates what the calculator predicts for vLLM {modelled}.")


def _check_machine(gpu: str, file: Path) -> recorded.MachineResults | None:
    data = recorded.load_results(file)
    if data is None:
        return None
    try:
        return data.machine(gpu)
    except recorded.RecordedError as err:
        raise ReportError(f"kv_alloc_check: {err}") from None


def _is_flag(row: dict) -> bool:
    return row["predicted"] == 1 and ("<=" in row["item"] or "equal" in row["item"])


def _cell(row: dict, value: int) -> str:
    if _is_flag(row):
        return "true" if value else "false"
    item = row["item"]
    if item.startswith("blocks") or "free blocks" in item or "requests admitted" in item:
        return f"{value:,}"
    return _bytes(value)


def _tolerance(row: dict) -> str:
    tol = row.get("tolerance", 0)
    if isinstance(tol, str):
        return tol + (f" (ratio {row['ratio']})" if "ratio" in row else "")
    return "exact" if not tol else f"± {_bytes(tol)}"


def kv_alloc_check_table(label: str | None = None, *, gpu: str, path: str | None = None) -> str:
    """Predicted against measured on the named GPU, row by row, for one configuration of the check (or all)."""
    file = Path(path) if path else CHECK_RESULT
    m = _check_machine(gpu, file)
    if m is None:
        return recorded.missing(file, CHECK_COMMAND)
    configs = [c for c in m.rows if label is None or c["label"] == label]
    if not configs:
        raise ReportError(f"kv_alloc_check_table({label!r}): labels on {m.label} are {[c['label'] for c in m.rows]}")
    blocks = [_provenance(m, configs)]
    for c in configs:
        bud = c["budget"]
        blocks.append(
            f"**{c['label']}**: {_model(c['model']).display_name}, TP={c['tensor_parallel_size']}"
            f"{' (one rank)' if c['tensor_parallel_size'] > 1 else ''}, KV {c['kv_cache_dtype']}, max_model_len {c['max_model_len']:,}: "
            f"{bud['num_blocks']:,} blocks × {bud['bytes_per_block']:,} B, maximum concurrency "
            f"{bud['max_concurrency']:,.2f}×.\n\n"
            "| Check | Predicted | Measured | Tolerance | OK |\n|---|---:|---:|---|---|\n"
            + "\n".join(f"| {r['item']} | {_cell(r, r['predicted'])} | {_cell(r, r['measured'])} | "
                        f"{_tolerance(r)} | {'yes' if r['ok'] else '**no**'} |" for r in c["rows"]))
    return "\n\n".join(blocks)


def kv_alloc_check_summary(*, gpu: str, path: str | None = None) -> str:
    """One line per configuration checked on the named GPU: the pool predicted and allocated, and the
    requests it admitted."""
    file = Path(path) if path else CHECK_RESULT
    m = _check_machine(gpu, file)
    if m is None:
        return recorded.missing(file, CHECK_COMMAND)
    lines = ["| Configuration | Blocks | Pool predicted | Pool allocated (driver) | Requests admitted, predicted / measured | All checks |",
             "|---|---:|---:|---:|---:|---|"]
    for c in m.rows:
        pool = next(r for r in c["rows"] if r["item"].startswith("KV pool (driver"))
        admitted = next(r for r in c["rows"] if "requests admitted" in r["item"])
        lines.append(
            f"| {_model(c['model']).display_name}, TP={c['tensor_parallel_size']}, KV {c['kv_cache_dtype']}, "
            f"L={c['max_model_len']:,} | {c['budget']['num_blocks']:,} | {_gib(pool['predicted'])} | "
            f"{_gib(pool['measured'])} | {admitted['predicted']:,} / {admitted['measured']:,} | "
            f"{'pass' if c['ok'] else '**fail**'} |")
    lines += ["", _provenance(m, m.rows)]
    return "\n".join(lines)


MACROS = [kv_budget, kv_budget_table, kv_budget_matrix, kv_knobs_table, kv_sizing_cli,
          kv_alloc_check_table, kv_alloc_check_summary]
