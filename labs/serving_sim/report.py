"""The simulator's page macros: macros.py registers every function in MACROS.

`{{ sim_table("chunked-prefill", budgets="512,2048") }}` renders what
`python -m labs.serving_sim chunked-prefill --budgets 512,2048` prints, through the same code
path as the CLI, so a page cannot drift from the command. Keyword arguments are the CLI's
flags with underscores; tuples and lists become comma-separated values.
"""

from __future__ import annotations

from labs.serving_sim.tables import sim_table

MACROS = [sim_table]
