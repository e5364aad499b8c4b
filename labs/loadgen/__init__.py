"""A load generator for any OpenAI-compatible endpoint: closed- and open-loop sweeps, the knee, Little's law.

``client`` sends one streamed request and times it as `vllm bench serve` does; ``stats``
turns a point's requests into TTFT, TPOT, ITL and E2E percentiles, throughput, goodput,
the knee and the Little's-law check; ``__main__`` runs the sweeps and writes the results;
``report`` renders recorded sweeps on the site. asyncio and aiohttp only (both on the GPU
machine), plus numpy for percentiles.
"""
