"""The FastAPI app: routes, the API-key middleware, admission control, and SSE streaming.

Routes, as `vllm serve` names them (labs/data/vllm.yaml, endpoints): POST
/v1/completions and /v1/chat/completions (streamed as server-sent events with
`"stream": true`), GET /v1/models, /health and /metrics.

The API key: like vLLM 0.33's AuthenticationMiddleware (vllm/entrypoints/serve/
middleware/authenticate.py), the check covers only paths that start with a guarded
prefix (`/v1`, `/v2`, `/inference`, `/cohere`, read from the facts file), so /health and
/metrics answer without a key, and a wrong or missing `Authorization: Bearer` header gets
401 `{"error": "Unauthorized"}`. Tokens are compared as SHA-256 digests in constant time.

Admission control: with `max_num_queued_reqs` set, a request that would make more than
that many requests in flight (waiting plus running) is refused with 503 before it reaches
the engine, and `vllm:admission_rejections_total{reason="max_num_queued_reqs"}` counts it,
as vLLM 0.33's `AsyncLLM.check_admission` does (vllm/v1/engine/async_llm.py). A 503 tells
a load balancer to retry elsewhere; queueing it instead would only raise every queued
request's TTFT.

Disconnects: a streamed response runs inside Starlette's StreamingResponse, which stops
iterating when the client goes away; a whole (non-streamed) response races the work
against `http.disconnect`, as vLLM's `with_cancellation` does. Either way the request's
`EngineClient.generate` is closed and the engine aborts it, freeing its KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from labs import vllm_facts
from labs.server import protocol
from labs.server.bridge import EngineClient, EngineThread
from labs.server.metrics import Metrics
from labs.server.protocol import ProtocolError

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
_SAMPLING_NAMES = ("max_tokens", "temperature", "top_p", "top_k", "seed")


class APIKeyMiddleware:
    """Pure ASGI middleware: a Bearer token is required on the guarded path prefixes only."""

    def __init__(self, app, tokens: list[str], prefixes: tuple[str, ...]):
        self.app = app
        self.digests = [hashlib.sha256(t.encode()).digest() for t in tokens]
        self.prefixes = prefixes

    def _ok(self, scope) -> bool:
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(token.encode("latin-1")).digest()
        match = False
        for d in self.digests:  # no early exit: the time taken says nothing about which token
            match |= secrets.compare_digest(digest, d)
        return match

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket") and scope.get("method") != "OPTIONS":
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            if path.startswith(self.prefixes) and not self._ok(scope):
                await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _error(exc: ProtocolError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _engine_error(message: str) -> ProtocolError:
    """An engine RequestError as a 400 whose param names the field the message starts with."""
    first = message.split(" ", 1)[0].strip("'")
    param = first if first in _SAMPLING_NAMES else ("prompt" if "prompt" in message else None)
    return ProtocolError(message, param)


def _sse(data) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


class _Detokenizer:
    """Text deltas from growing token ids: decode all, send what is new (the API side's job, as in vLLM)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""

    def add(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids)
        n = 0  # common prefix with what was sent (a byte run can complete a character sent as U+FFFD)
        limit = min(len(text), len(self.text))
        while n < limit and text[n] == self.text[n]:
            n += 1
        delta, self.text = text[n:], text
        return delta


def build_app(llm, served_model_name: str | None = None, api_keys: list[str] | None = None,
              max_num_queued_reqs: int | None = None) -> FastAPI:
    """An app serving `llm` (a labs.engine.LLM). The engine thread starts and stops with the app."""
    model = served_model_name or llm.model_name
    metrics = Metrics(model)
    engine = EngineThread(llm, metrics)
    client = EngineClient(engine)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    app = FastAPI(lifespan=lifespan, title="labs.server", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine, app.state.client, app.state.metrics = engine, client, metrics
    if api_keys:
        prefixes = tuple(vllm_facts.api_key_prefixes())
        app.add_middleware(APIKeyMiddleware, tokens=list(api_keys), prefixes=prefixes)

    @app.get("/health")
    async def health():
        if engine.alive:
            return Response(status_code=200)
        return JSONResponse(protocol.error_body("the engine is dead", "InternalServerError", 503), status_code=503)

    @app.get("/metrics")
    async def prom():
        return PlainTextResponse(metrics.render(engine.gauges()), media_type=PROMETHEUS_TEXT)

    @app.get("/v1/models")
    async def models():
        card = {"id": model, "object": "model", "created": int(time.time()), "owned_by": "labs", "root": model,
                "parent": None, "max_model_len": llm.config.max_model_len}
        return {"object": "list", "data": [card]}

    async def serve(request: Request, chat: bool):
        try:
            try:
                body = json.loads(await request.body())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ProtocolError(f"the request body is not valid JSON ({exc})") from None
            p = protocol.parse_chat(body, model) if chat else protocol.parse_completion(body, model)
            # Tokenize here, on the API side, as vLLM's API server does: the engine sees only ids.
            ids = llm.tokenizer.encode(p.prompt) if isinstance(p.prompt, str) else p.prompt
            protocol.resolve_length(p, len(ids), llm.config.max_model_len)
        except ProtocolError as exc:
            return _error(exc)
        if not engine.alive:
            return _error(ProtocolError("the engine is dead", status=503, type_="InternalServerError"))
        if max_num_queued_reqs is not None and client.in_flight + 1 > max_num_queued_reqs:
            metrics.inc("vllm:admission_rejections", reason="max_num_queued_reqs")
            return _error(ProtocolError("The engine is currently busy and cannot accept new requests. Please try "
                                        "again later or on a different instance.", status=503,
                                        type_="Service Unavailable"))
        events = client.generate(ids, p.sampling)
        first = await events.__anext__()
        if first.error is not None:
            await events.aclose()
            if first.engine_dead:
                return _error(ProtocolError(first.error, status=500, type_="InternalServerError"))
            return _error(_engine_error(first.error))
        rid = protocol.new_id(chat)
        if p.stream:
            return StreamingResponse(_stream(p, rid, first.prompt_tokens, events, llm.tokenizer),
                                     media_type="text/event-stream")
        work = asyncio.ensure_future(_collect(p, rid, first.prompt_tokens, events, llm.tokenizer))
        gone = asyncio.ensure_future(_disconnected(request))
        done, _ = await asyncio.wait([work, gone], return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            gone.cancel()
            return work.result()
        work.cancel()  # the client left: closing `events` aborts the request in the engine
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return Response()

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await serve(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await serve(request, chat=True)

    return app


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(p, rid: str, prompt_tokens: int, events, tokenizer):
    ids: list[int] = []
    try:
        async for ev in events:
            if ev.error is not None:
                return _error(ProtocolError(ev.error, status=500, type_="InternalServerError"))
            ids.extend(ev.token_ids)
            if ev.finish_reason is not None:
                u = protocol.usage(prompt_tokens, len(ids), ev.cached_tokens)
                return JSONResponse(protocol.full_response(p, rid, tokenizer.decode(ids), ev.finish_reason, u))
    finally:
        await events.aclose()


async def _stream(p, rid: str, prompt_tokens: int, events, tokenizer):
    created = int(time.time())
    detok = _Detokenizer(tokenizer)
    role_sent = not p.chat
    try:
        async for ev in events:
            if ev.error is not None:
                yield _sse(protocol.error_body(ev.error, "InternalServerError", 500))
                break
            out = ""
            if not role_sent:
                out += _sse(protocol.chunk(p, rid, created, None, None, role=True))
                role_sent = True
            out += _sse(protocol.chunk(p, rid, created, detok.add(ev.token_ids), ev.finish_reason))
            if ev.finish_reason is not None:
                if p.include_usage:
                    u = protocol.usage(prompt_tokens, len(detok.ids), ev.cached_tokens)
                    out += _sse(protocol.usage_chunk(p, rid, created, u))
                out += "data: [DONE]\n\n"
            yield out
    finally:
        await events.aclose()
