"""Simulator output as Markdown, for a page macro (`sim_table`).

A lesson that shows a simulator table calls the same code path as the CLI, so
the page cannot drift from what `python -m labs.serving_sim ...` prints:

    {{ sim_table("chunked-prefill", budgets="512,2048") }}

Keyword arguments are the CLI's flags with underscores (`long_prompt_len=8192`);
tuples and lists become comma-separated values.
"""

from __future__ import annotations

from labs.serving_sim.cli import SUBCOMMANDS, parser, run
from labs.specs import SpecError


def sim_table(kind: str, **options) -> str:
    """The Markdown `python -m labs.serving_sim <kind> [--flag value ...]` prints."""
    if kind not in SUBCOMMANDS:
        raise SpecError(f"sim_table: unknown simulation {kind!r}; choose one of {', '.join(SUBCOMMANDS)}")
    argv = [kind]
    for key, value in options.items():
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        argv += [f"--{key.replace('_', '-')}", str(value)]
    try:
        args = parser().parse_args(argv)
    except SystemExit:
        raise SpecError(f"sim_table: bad options for {kind}: {options}") from None
    return run(args)[1]
