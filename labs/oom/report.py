"""The OOM lab's recorded runs as Markdown for the site. No torch here.

Everything shown comes from labs/results/oom.json, which
`python -m labs.oom --scenario all --out DIR --record` writes on a CUDA GPU
through labs/recorded.py: one row per scenario and GPU, with the text the CLI
printed for it (its `transcript`) and the numbers behind it. Every macro takes
the GPU it shows (`gpu="H200"`), and the text it renders names it. macros.py registers every function in `MACROS` as a page
macro under its own name, hence the `oom_` prefix.
"""

from __future__ import annotations

from pathlib import Path

from labs import recorded, specs
from labs.kv_sizing.memory_budget import estimate_activation_peak
from labs.oom.transcript import format_report

RESULT = recorded.RESULTS_DIR / "oom.json"
RECORD_COMMAND = "python -m labs.oom --scenario all --out /tmp/oom --record"
GIB, MIB = 2**30, 2**20


class ReportError(ValueError):
    """A macro asked for a GPU or scenario the recorded file does not hold; the build fails with this."""


def _provenance(m: recorded.MachineResults, rows: list[dict]) -> str:
    runs = []
    for r in rows:
        if r["run"] not in runs:
            runs.append(r["run"])
    parts = []
    for run in runs:
        v = run.get("versions", {})
        parts.append(f"{run['total_memory_bytes'] / GIB:.2f} GiB as cudaMemGetInfo reports it, on {run['date']}, "
                     f"torch {v.get('torch', '?')}, CUDA {v.get('cuda', '?')}")
    return f"Recorded on an {m.label} ({'; '.join(parts)})."


def _machine(gpu: str, file: Path) -> recorded.MachineResults | None:
    """The named GPU's rows, or None when the file does not exist."""
    data = recorded.load_results(file)
    if data is None:
        return None
    try:
        return data.machine(gpu)
    except recorded.RecordedError as err:
        raise ReportError(f"oom: {err}") from None


def _scenario(m: recorded.MachineResults, name: str) -> dict:
    if not m.has(scenario=name):
        raise ReportError(f"oom: no recorded scenario {name!r} on {m.label}; recorded: "
                          f"{sorted(r['scenario'] for r in m.rows)}")
    return m.row(scenario=name)


def _size(n: int) -> str:
    return f"{n / GIB:,.2f} GiB" if n >= GIB else f"{n / MIB:,.0f} MiB"


def oom_result(name: str, *, gpu: str, path: str | None = None) -> dict:
    """One scenario's report recorded on the named GPU, for pages that quote a single number (`.evidence.free`)."""
    file = Path(path) if path else RESULT
    m = _machine(gpu, file)
    if m is None:
        raise ReportError(f"{recorded.shown_path(file)} does not exist: on a CUDA GPU, run "
                          f"`python -m labs.oom --scenario {name} --out /tmp/oom --record`")
    return _scenario(m, name)


def oom_scenario(name: str, *, gpu: str, path: str | None = None) -> str:
    """The output of `python -m labs.oom --scenario NAME` recorded on the named GPU, in a text block, with where it ran."""
    file = Path(path) if path else RESULT
    m = _machine(gpu, file)
    if m is None:
        return recorded.missing(file, f"python -m labs.oom --scenario {name} --out /tmp/oom --record")
    r = _scenario(m, name)
    # A row recorded before transcripts were stored: the same formatter the CLI prints with.
    text = r.get("transcript") or format_report(r)
    return f"```text\n{text}\n```\n\n{_provenance(m, [r])}"


def oom_summary_table(*, gpu: str, path: str | None = None) -> str:
    """One row per scenario recorded on the named GPU: the error, the diagnosed cause, the fix and whether the
    run after it passed."""
    file = Path(path) if path else RESULT
    m = _machine(gpu, file)
    if m is None:
        return recorded.missing(file, RECORD_COMMAND)
    lines = ["| Scenario | What failed | Diagnosed as | Fix applied | After the fix | Memory back to baseline |",
             "|---|---|---|---|---|---|"]
    for r in m.rows:
        name = r["scenario"]
        error = r["failure"]["error"].split(":")[0]
        lines.append(f"| `{name}` | `{error}` | {r['diagnosis']['kind']} | `{r['fix']['knob']}` | "
                     f"{'passed' if r['fix']['passed'] else '**failed**'} | "
                     f"{'yes' if r['memory']['back_to_baseline'] else '**no**'} |")
    return "\n".join(lines) + "\n\n" + _provenance(m, m.rows)


def oom_prefill_peaks_table(*, gpu: str, path: str | None = None) -> str:
    """Activation peak of one decoder layer against batched tokens, measured on the named GPU, beside the
    calculator's estimate."""
    file = Path(path) if path else RESULT
    m = _machine(gpu, file)
    if m is None:
        return recorded.missing(file, "python -m labs.oom --scenario prefill-activation --out /tmp/oom --record")
    r = _scenario(m, "prefill-activation")
    model = specs.get_model(r["model"])
    lines = ["| Batched tokens | Measured peak (torch) | Per token | Calculator's MLP estimate | Measured ÷ estimate |",
             "|---:|---:|---:|---:|---:|"]
    for p in r["peak_vs_tokens"]:
        t, peak = p["batched_tokens"], p["peak_bytes"]
        est = estimate_activation_peak(model, t, 0)  # no sampler rows: this is one layer's forward
        lines.append(f"| {t:,} | {_size(peak)} | {peak / t / 1024:,.0f} KiB | {_size(est)} | {peak / est:.2f} |")
    fix, setup = r["fix"], r["setup"]
    per_token = r["activation_bytes_per_token"]
    lines += [
        "",
        f"One {model.display_name}-shaped decoder layer with random bf16 weights, eager PyTorch. The slope is "
        f"{per_token / 1024:,.0f} KiB per batched token. A {setup['batched_tokens']:,}-token prefill in one step "
        f"would need about {_size(setup['batched_tokens'] * per_token)} with {_size(setup['headroom'])} left beside "
        f"the pool, and failed; the same prompt in chunks of {fix['chunk_tokens']:,} tokens peaked at "
        f"{_size(fix['peak_bytes'])} and finished all {fix['tokens_prefilled']:,} tokens. "
        f"Chunked and one-step outputs differ by at most {r['chunked_max_abs_diff']:g} (bf16, checked at 2,048 tokens). "
        + _provenance(m, [r]),
    ]
    return "\n".join(lines)


MACROS = [oom_result, oom_scenario, oom_summary_table, oom_prefill_peaks_table]
