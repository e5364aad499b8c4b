"""Reproduce an out-of-memory failure of LLM serving on this GPU, diagnose it, fix it.

    python -m labs.oom --scenario kv-too-small
    python -m labs.oom --scenario prefill-activation --snapshot /tmp/prefill.pickle
    python -m labs.oom --scenario all --out DIR --record

Scenarios: kv-too-small, prefill-activation, two-instances, fragmentation.
Each prints what failed, the evidence (driver free/total, the allocator's
reserved/allocated, the largest free cached block), the cause in one line, the
knob that fixes it, and the run after the fix. Open a --snapshot file at
https://pytorch.org/memory_viz.

Exit codes: 0 when every scenario failed as predicted, was fixed, and left
memory at its baseline; 1 otherwise; 2 without a CUDA GPU or on bad input.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

from labs import cli
from labs.oom.transcript import format_report
from labs.recorded import RESULTS_DIR, Machine, RecordedError, record_rows

RESULT = RESULTS_DIR / "oom.json"
NAMES = ("kv-too-small", "prefill-activation", "two-instances", "fragmentation")


def _parser() -> argparse.ArgumentParser:
    p = cli.Parser(prog="python -m labs.oom", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--scenario", choices=(*NAMES, "all"),
                   help="which failure to reproduce ('all' runs the four in turn)")
    p.add_argument("--snapshot", metavar="PATH", type=cli.output_file,
                   help="write a memory snapshot for PyTorch's memory viewer; with 'all', one per scenario "
                        "(PATH gets the scenario name inserted before its suffix)")
    p.add_argument("--out", metavar="DIR", type=cli.output_dir,
                   help="write the report as DIR/oom.json (DIR is created if missing)")
    p.add_argument("--record", action="store_true",
                   help="also merge the scenarios run into labs/results/oom.json, which the site renders "
                        "(each with the text printed for it, as 'transcript'); other scenarios and other "
                        "GPUs stay, and a scenario that did not behave as predicted does not replace one "
                        "that did")
    p.add_argument("--replace", action="store_true",
                   help="with --record: record a scenario that did not behave as predicted even over one that did")
    p.add_argument("--fragment-child", action="store_true",
                   help="internal: run the fragmentation allocation pattern in this fresh process and print JSON")
    return p


def _snapshot_path(base: Path | None, name: str, many: bool) -> str | None:
    if not base or not many:
        return str(base) if base else None
    p = Path(base)
    return str(p.with_name(f"{p.stem}-{name}{p.suffix}"))


def record(doc: dict, path: Path | None = None, replace: bool = False):
    """Merge one run's document (as --out writes it) into the recorded file, one row per scenario."""
    run = {k: doc[k] for k in ("date", "total_memory_bytes", "versions")}
    rows = [{**report, "ok": bool(report["as_predicted"])} for report in doc["scenarios"].values()]
    return record_rows(path or RESULT, "oom", Machine(doc["gpu"]), rows, ["scenario"], run, replace=replace)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    # Every argument is checked before torch or CUDA: a bad flag is reported as such, on any machine.
    if not args.scenario and not args.fragment_child:
        cli.reject(parser, "--scenario", "is required: one of " + ", ".join((*NAMES, "all")))
    if args.replace and not args.record:
        cli.reject(parser, "--replace", "only applies with --record")
    try:
        import torch
    except ImportError:
        print("error: the OOM lab needs torch (pip install -e '.[labs]')", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: the OOM lab needs a CUDA GPU: torch.cuda.is_available() is False, so there is no "
              "GPU memory to run out of", file=sys.stderr)
        return 2
    from labs.oom import scenarios

    if args.fragment_child:
        print(json.dumps(scenarios.fragment_child(str(args.snapshot) if args.snapshot else None)))
        return 0
    names = NAMES if args.scenario == "all" else (args.scenario,)
    reports = {}
    for name in names:
        try:
            reports[name] = scenarios.RUNNERS[name](_snapshot_path(args.snapshot, name, len(names) > 1))
        except RuntimeError as exc:  # e.g. a GPU too small for the model-shaped layer
            print(f"error: {name}: {exc}", file=sys.stderr)
            return 2
        # Keep the printed text with the numbers it came from, so the site can show it.
        reports[name]["transcript"] = format_report(reports[name])
        print(reports[name]["transcript"] + "\n")
    doc = {"lab": "oom", "date": datetime.date.today().isoformat(), "gpu": torch.cuda.get_device_name(),
           "total_memory_bytes": torch.cuda.mem_get_info()[1],
           "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                        "python": platform.python_version()},
           "scenarios": reports}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "oom.json").write_text(json.dumps(doc, indent=2) + "\n")
    if args.record:
        try:
            print(record(doc, replace=args.replace))
        except RecordedError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    return 0 if all(r["as_predicted"] for r in reports.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
