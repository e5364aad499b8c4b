"""A torch-free serving simulator: what vLLM's scheduler does to throughput and latency.

Modules, in the order a run uses them:

* ``trace``: seeded synthetic requests (arrival, prompt length, output length).
* ``cost``: roofline time of one engine step from the model's geometry and the
  GPU's datasheet (labs/data), max(bytes / bandwidth, FLOPs / FLOP/s).
* ``engine``: static batching and an iteration-level scheduler in the shape of
  vLLM 0.33's V1 ``Scheduler.schedule`` (token budget, max_num_seqs, KV blocks,
  chunked prefill, recompute preemption).
* ``spec_decode``: expected tokens per speculative step and the speedup.
* ``defaults``: vLLM's per-GPU batch defaults, read from labs/data/vllm.yaml.
* ``scenarios``: the experiments; ``report`` and ``tables`` print them.

Run ``python -m labs.serving_sim --help``. Every number is derived, not measured.
"""
