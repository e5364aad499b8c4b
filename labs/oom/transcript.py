"""The text `python -m labs.oom` prints for one scenario, built from the scenario's report dict.

It lives apart from the CLI, torch-free, because three readers need the same
words: the CLI prints it, `--record` stores it in labs/results/oom.json beside
the numbers it came from, and the site shows the recorded text. A page that
shows a transcript can therefore never disagree with the recorded numbers:
tests/test_lab_reports.py rebuilds each stored transcript from its report.
"""

from __future__ import annotations

GIB = 2**30


def _g(x: int) -> str:
    return f"{x / GIB:.2f} GiB"


def format_report(r: dict) -> str:
    """What failed, the evidence, the cause, the knob, the run after the fix, and the memory check."""
    ev, dg = r["evidence"], r["diagnosis"]
    lines = [f"=== {r['scenario']} ===", f"what failed : {r['failure']['error']}"]
    if r["failure"].get("cuda_error"):
        lines.append(f"              {r['failure']['cuda_error']}")
    lines.append(f"evidence    : driver free {_g(ev['free'])} of {_g(ev['total'])}; reserved {_g(ev['reserved'])}, "
                 f"allocated {_g(ev['allocated'])}; largest free cached block {_g(ev['largest_free_block'])}; "
                 f"requested {_g(ev['requested'])}")
    if "peak_vs_tokens" in r:
        sweep = ", ".join(f"{p['batched_tokens']}: {_g(p['peak_bytes'])}" for p in r["peak_vs_tokens"])
        lines.append(f"peak/tokens : {sweep}  ({r['activation_bytes_per_token'] / 1024:.0f} KiB per token)")
    lines.append(f"cause       : {dg['cause']}")
    lines.append(f"knob        : {dg['knob']}")
    fix = r["fix"]
    lines.append(f"after fix   : {fix['knob']} -> {'passed' if fix['passed'] else 'FAILED'}"
                 + (f" (peak {_g(fix['peak_bytes'])})" if "peak_bytes" in fix else ""))
    m = r["memory"]
    lines.append(f"memory      : allocated {m['start']['allocated']} -> {m['end']['allocated']} bytes, driver used "
                 f"{_g(m['start']['used'])} -> {_g(m['end']['used'])}: "
                 f"{'back to baseline' if m['back_to_baseline'] else 'NOT back to baseline'}")
    lines.append(f"as predicted: {r['as_predicted']}")
    return "\n".join(lines)
