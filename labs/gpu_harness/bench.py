"""The command line every Part 3 lab shares: --out, --record, --reps, --only; and where results go.

A lab's `__main__` builds its parser here, runs its experiments, and hands the rows to
`finish`, which prints where they went. Results reach `--out` and, with `--record`,
`labs/results/<lab>.json` only after every experiment finished.
"""

from __future__ import annotations

import sys
from pathlib import Path

from labs import recorded
from labs.gpu_harness import results
from labs.cli import Parser, count, output_dir, reject


def parser(prog: str, description: str, experiments: tuple[str, ...], results_path: Path) -> Parser:
    p = Parser(prog=prog, description=description)
    p.add_argument("--out", type=output_dir, metavar="DIR", help="folder to write the results JSON into")
    p.add_argument("--record", action="store_true",
                   help=f"also store this GPU's entry in labs/results/{results_path.name} (only after every "
                   "experiment ran; other GPUs' entries are kept); needs every experiment, so no --only")
    p.add_argument("--reps", type=count(1000, "timed calls per measurement"), default=20, metavar="N",
                   help="timed calls per measurement, 1 to 1000 (default 20); the median is reported")
    p.add_argument("--only", action="append", choices=experiments, metavar="NAME",
                   help=f"run only this experiment (repeatable): {', '.join(experiments)}")
    return p


def validate(p: Parser, args) -> tuple[str, ...]:
    """The experiments to run; refuses --record with --only (a partial entry)."""
    if args.record and args.only:
        reject(p, "--record", "stores every experiment's rows: run it without --only")
    return tuple(args.only) if args.only else None


def finish(lab: str, env: dict, extra_run: dict, sections: dict, lab_module, out: Path | None, record: bool,
           results_path: Path) -> None:
    """Write the run to --out and, with --record, merge it into the lab's results file (labs/recorded.py)."""
    args = (lab, env, extra_run, sections, lab_module.config_name, lab_module.printed)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        print(results.record(out / results_path.name, *args))
    if record:
        print(results.record(results_path, *args))
        if out is not None:  # the device machine returns only --out: keep the whole recorded file there
            recorded.write_atomic(out / f"recorded_{results_path.name}", results_path.read_text(encoding="utf-8"))


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1
