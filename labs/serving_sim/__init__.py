"""A torch-free serving simulator: the engine's scheduler, timed by a roofline instead of a GPU.

The scheduling is not re-implemented here: ``labs.engine.scheduler`` (with its block manager)
decides every step, exactly as it does for the engine on a GPU. This package supplies what a
simulation needs around it, in the order a run uses them:

* ``trace``: seeded synthetic requests (arrival, prompt length, output length).
* ``cost``: roofline time of one engine step from the model's geometry and the GPU's
  datasheet (labs/data), max(bytes / bandwidth, FLOPs / FLOP/s).
* ``clock``: the clock the scheduler is given; each step moves it by the step's cost.
* ``driver``: the loop (arrivals, schedule, advance the clock, update) for the continuous
  and static policies.
* ``metrics``: TTFT, TPOT, ITL and throughput of a run, and the Markdown tables.
* ``spec_decode``: expected tokens per speculative step and the speedup.
* ``defaults``: vLLM's per-GPU batch defaults, read from labs/data/vllm.yaml.
* ``scenarios``: the experiments; ``cli`` prints them, ``tables`` and ``report`` put them on pages.

Run ``python -m labs.serving_sim --help``. Every number is derived, not measured.
"""
