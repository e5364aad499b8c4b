"""The structured-decoding lab's recorded results for the site: the table, the plot, single figures.

macros.py registers `MACROS`. Pages call `structured_table()`, `structured_plot(page.url)`,
`structured_row(4096)` (one recorded row, to quote a figure), `structured_env()` (machine and
date), and `bitmask_bytes("llama-3.1-8b", 256)` for vLLM's packed mask of a real vocabulary.
Reads labs/results/structured.json only: no tokenizers, no training at build time.
"""

from __future__ import annotations

from labs import recorded
from labs.structured.masks import packed_bytes

RESULTS = recorded.RESULTS_DIR / "structured.json"
COMMAND = "python -m labs.structured --out out/structured --record"
MACHINE = "CPU"


class StructuredResultsError(LookupError):
    pass


def _machine():
    res = recorded.load_results(RESULTS)
    if res is None or not res.has(MACHINE):
        raise StructuredResultsError(f"{recorded.shown_path(RESULTS)} has no recorded run; run `{COMMAND}`")
    return res.machine(MACHINE)


def _rows() -> list[dict]:
    return sorted(_machine().rows, key=lambda r: r["vocab_size"])


def structured_row(vocab_size: int) -> dict:
    """One recorded row, by the vocabulary size asked for."""
    return _machine().row(vocab_size=vocab_size)


def structured_env() -> str:
    m = _machine()
    run = m.runs[-1]
    return (f"CPU: one core's share of a 2-core {run['cpu']} shared with other jobs, {m.dates} "
            f"(Python {run['python']}, numpy {run['numpy']}, tokenizers {run['tokenizers']}); "
            "on such a machine timings vary run to run by up to a factor of 2.")


def structured_table() -> str:
    lines = ["| Vocabulary | DFA states | Precompute all masks | Table (int32) | Packed masks | Step: lookup | "
             "Step: lazy row | Step: trie walk | Constrained: conform | Free: conform (random, bigram) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in _rows():
        n = r["samples"]
        lines.append(
            f"| {r['tokens']:,} | {r['states']:,} | {r['precompute_ms']:,.0f} ms | {r['table_bytes'] / 2**20:,.1f} MiB "
            f"| {r['packed_mask_bytes'] / 2**10:,.0f} KiB | {r['step_lookup_us']:,.0f} µs | "
            f"{r['step_lazy_us'] / 1e3:,.2f} ms | {r['step_trie_us'] / 1e3:,.2f} ms | "
            f"{r['random_constrained_conform'] + r['bigram_constrained_conform']} / {2 * n} | "
            f"{r['random_free_conform']} / {n}, {r['bigram_free_conform']} / {n} |")
    return "\n".join(lines)


def structured_truth_table() -> str:
    lines = ["| Vocabulary | Bigram, masked: parse | conform | true | Bigram, free: parse | conform | true |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in _rows():
        n = r["samples"]
        lines.append(f"| {r['tokens']:,} | {r['bigram_constrained_parsed']} / {n} | {r['bigram_constrained_conform']} / {n} "
                     f"| {r['bigram_constrained_true']} / {n} | {r['bigram_free_parsed']} / {n} "
                     f"| {r['bigram_free_conform']} / {n} | {r['bigram_free_true']} / {n} |")
    return "\n".join(lines)


def structured_boundary_tokens(vocab_size: int) -> str:
    """The boundary-spanning tokens the masked bigram samples used, as code spans."""
    return ", ".join(f"`{t}`" for t in structured_row(vocab_size)["boundary_tokens_used"])


def bitmask_bytes(model: str, batch: int = 1) -> int:
    """Bytes of vLLM's packed grammar bitmask for `batch` rows: cdiv(vocab, 32) int32 words per row."""
    from labs import specs

    return batch * packed_bytes(specs.get_model(model).vocab_size)


def structured_plot(page_url: str) -> str:
    """Mask cost against vocabulary size: precompute for every state, and one step three ways (measured, CPU)."""
    import plotting  # docs/.hooks, on the path during the site build

    rows = _rows()
    xs = [r["tokens"] for r in rows]
    series = {
        "precompute, all states (ms)": (xs, [r["precompute_ms"] for r in rows]),
        "step: lazy row (ms)": (xs, [r["step_lazy_us"] / 1e3 for r in rows]),
        "step: trie walk (ms)": (xs, [r["step_trie_us"] / 1e3 for r in rows]),
        "step: lookup + apply (ms)": (xs, [r["step_lookup_us"] / 1e3 for r in rows]),
    }
    table = plotting.markdown_table(["Series", "Vocabulary", "ms"],
                                    [[k, f"{x:,}", f"{y:,.3f}"] for k, (a, b) in series.items() for x, y in zip(a, b)])
    return plotting.lines("structured-mask-cost", page_url, series, x_label="vocabulary size (tokens, log)",
                          y_label="CPU time (ms, log)", log_x=True, log_y=True,
                          title="Token-mask cost against vocabulary size (measured, CPU)",
                          caption=f"{structured_env()} The lab's schema compiles to one DFA for every vocabulary; "
                                  "precomputing walks every token from every state once, after which a step only "
                                  "looks up its row.", table=table, size=(6.4, 4.2))


MACROS = [structured_row, structured_env, structured_table, structured_truth_table, structured_boundary_tokens,
          bitmask_bytes, structured_plot]
