"""An OpenAI-compatible HTTP server around labs.engine, on FastAPI and uvicorn as `vllm serve` is.

Modules, in the order a request meets them: ``app`` (routes, the API-key check, admission
control, SSE), ``protocol`` (request validation, OpenAI-shaped bodies and error bodies),
``bridge`` (the engine's own thread and the asyncio side that talks to it), ``metrics``
(Prometheus text under vLLM 0.33's metric names), and ``__main__`` (the command line).

    python -m labs.server --tiny --device cpu --port 8000          # CI-sized random model
    python -m labs.server --model llama-3.1-8b --port 8000         # Llama-3.1-8B shapes on a GPU

FastAPI (and through it pydantic) is needed only here; the engine and the load generator
run without it.
"""
