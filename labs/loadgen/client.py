"""One streamed request to an OpenAI-compatible endpoint, timed the way `vllm bench serve` times it.

The timing rules are those of vLLM 0.33's request functions
(vllm/benchmarks/lib/endpoint_request_func.py, async_request_openai_completions and
async_request_openai_chat_completions):

* the clock starts just before the POST;
* TTFT is the arrival of the first SSE event that carries output (a completions chunk
  with `choices`, or a chat delta with content; chat's opening role-only delta does not
  count);
* each later output event appends one inter-token latency (ITL), the gap since the
  previous output event;
* E2E latency ends at the last output event (the trailing usage chunk and `[DONE]` do
  not move it);
* the output length is the server's `usage.completion_tokens` (requested with
  `stream_options.include_usage`), not a count of events.

A request succeeds when it got a 200 and at least one output event. Anything else is a
failure with its reason kept (HTTP status and the server's message, or the exception).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field


@dataclass
class Result:
    start: float = 0.0  # perf_counter at send
    ttft: float = 0.0
    latency: float = 0.0  # E2E
    itl: list[float] = field(default_factory=list)
    prompt_len: int = 0
    output_tokens: int = 0
    success: bool = False
    error: str = ""


def payload(endpoint: str, model: str, prompt, max_tokens: int, ignore_eos: bool) -> dict:
    """The request body: greedy, streamed, usage included, as `vllm bench serve` sends it."""
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    if endpoint.endswith("/chat/completions"):
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if ignore_eos:
        body["ignore_eos"] = True
    return body


def _has_output(choice: dict, chat: bool) -> bool:
    if not chat:
        return True
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return False
    return bool(delta.get("content")) or (delta.get("content") == "" and "role" not in delta)


async def send(session, url: str, body: dict, prompt_len: int, headers: dict, timeout: float) -> Result:
    """POST `body` to `url` and time its stream. Never raises: a failure is a Result with `error`."""
    import aiohttp

    chat = "messages" in body
    out = Result(prompt_len=prompt_len)
    st = time.perf_counter()
    out.start = last = st
    got_output = False
    try:
        async with session.post(url, json=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            if resp.status != 200:
                text = (await resp.text())[:300]
                out.error = f"HTTP {resp.status}: {text}"
                return out
            buffer = b""
            async for piece in resp.content.iter_any():
                buffer += piece
                while b"\n\n" in buffer:
                    message, buffer = buffer.split(b"\n\n", 1)
                    message = message.strip()
                    if not message.startswith(b"data: "):
                        continue  # SSE comments (": ping") and blank keep-alives
                    data = message[6:]
                    if data == b"[DONE]":
                        continue
                    now = time.perf_counter()
                    event = json.loads(data)
                    if "error" in event and not event.get("choices"):
                        out.error = f"error event: {str(event['error'])[:300]}"
                        return out
                    choices = event.get("choices")
                    if choices and _has_output(choices[0], chat):
                        if not got_output:
                            got_output = True
                            out.ttft = now - st
                        else:
                            out.itl.append(now - last)
                        last = now
                    elif event.get("usage"):
                        out.output_tokens = event["usage"].get("completion_tokens") or 0
                        out.prompt_len = event["usage"].get("prompt_tokens") or prompt_len
        if got_output:
            out.success = True
            out.latency = last - st
        else:
            out.error = "no output event arrived, so there is no TTFT"
    except asyncio.CancelledError:
        out.error = "cut off at the end of the run"
        raise
    except Exception as exc:  # a refused connection, a timeout, bad JSON: the request failed
        out.error = f"{type(exc).__name__}: {exc}"[:300]
    return out
