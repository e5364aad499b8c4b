"""python -m labs.structured: a JSON schema -> regex -> DFA -> per-step token masks over trained BPE vocabularies (CPU).

    python -m labs.structured                          # 1K, 4K and 16K vocabularies, 200 samples each
    python -m labs.structured --out out/structured --record
    python -m labs.structured --quick                  # one small vocabulary, seconds

For each vocabulary size it trains a byte-level BPE on text it generates, compiles the lab's
schema to a DFA, precomputes every state's mask, checks the table against a byte-by-byte
walk, times a step three ways (precomputed lookup, lazy vectorised row, lazy trie walk),
and samples with and without the mask from random logits and from a bigram model, counting
outputs that parse, that conform to the schema, and that are true.
"""

from __future__ import annotations

import datetime
import platform
import sys
from pathlib import Path

from labs import recorded
from labs.cli import Parser, bounded_int, count, number_list, output_dir

LAB = "structured"
RESULTS_PATH = recorded.RESULTS_DIR / f"{LAB}.json"
MACHINE = recorded.Machine("CPU")
KEY = ("vocab_size",)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m labs.structured", description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab-sizes", type=number_list(bounded_int(300, 32768), max_items=6),
                   default=(1024, 4096, 16384), metavar="N,N", help="BPE vocabulary sizes (default 1024,4096,16384)")
    p.add_argument("--samples", type=count(2000), default=200, help="samples per model and mode (default 200)")
    p.add_argument("--corpus-lines", type=bounded_int(1000, 200_000), default=30_000,
                   help="lines of generated training text (default 30000)")
    p.add_argument("--seed", type=bounded_int(0, 2**31 - 1), default=0, help="seed of the corpus and the samples")
    p.add_argument("--quick", action="store_true", help="one 600-token vocabulary, 30 samples; cannot be recorded")
    p.add_argument("--out", type=output_dir, metavar="DIR", help="folder to write structured.json into")
    p.add_argument("--record", action="store_true", help=f"also merge the rows into labs/results/{RESULTS_PATH.name}")
    p.add_argument("--replace", action="store_true", help="let a failing row replace a passing recorded one")
    args = p.parse_args(argv)
    if args.record and args.quick:
        p.error("argument --record: stores full runs only; run it without --quick")

    import numpy
    import tokenizers

    from labs.structured import lab, vocab

    sizes, samples, lines = ((600,), 30, 2000) if args.quick else (args.vocab_sizes, args.samples, args.corpus_lines)
    corpus = vocab.corpus(lines, args.seed, distinct_words=3000 if args.quick else 40_000)
    rows = [lab.run_one(n, corpus, samples, args.seed) for n in sizes]
    run = {"date": datetime.date.today().isoformat(), "cpu": _cpu(), "python": platform.python_version(),
           "numpy": numpy.__version__, "tokenizers": tokenizers.__version__, "corpus_lines": lines,
           "seed": args.seed, "quick": args.quick}
    targets = ([Path(args.out) / RESULTS_PATH.name] if args.out else []) + ([RESULTS_PATH] if args.record else [])
    for path in targets:
        print(recorded.record_rows(path, LAB, MACHINE, rows, KEY, run, replace=args.replace))
    failed = [r["vocab_size"] for r in rows if not r["ok"]]
    if failed:
        print(f"FAILED at vocabulary sizes {failed}: a constrained sample did not conform or a mask row was wrong",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
