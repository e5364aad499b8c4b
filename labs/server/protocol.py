"""Request checks and response bodies for /v1/completions and /v1/chat/completions.

A request body is checked field by field before anything reaches the engine, and a bad
one gets the error body vLLM 0.33 sends (`ErrorResponse` in vllm/entrypoints/openai/
engine/protocol.py, built by create_error_response in vllm/entrypoints/serve/
exception_handling/error_response.py):

    {"error": {"message": "...", "type": "BadRequestError", "param": "max_tokens", "code": 400}}

The `openai` client turns that into `openai.BadRequestError` with the message intact.
Fields this engine cannot honour (n > 1, logprobs, stop strings, penalties) are refused
by name with a 400 rather than silently ignored: a benchmark that asked for them should
know it did not get them. vLLM itself accepts unknown fields and logs a warning; here an
unknown field is a 400 too, so a typo (`max_token`) cannot pass unnoticed.

Plain Python over the parsed JSON, no pydantic models: each check's message names the
field and what is allowed.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

MAX_TOKENS_DEFAULT = 16  # OpenAI's and vLLM's default for /v1/completions


class ProtocolError(ValueError):
    """A request the server refuses; `status`, `type` and `param` go into the error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, type_: str = "BadRequestError"):
        super().__init__(message)
        self.message, self.param, self.status, self.type = message, param, status, type_

    def body(self) -> dict:
        return error_body(self.message, self.type, self.status, self.param)


def error_body(message: str, type_: str, code: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# Fields accepted only with the value that means "off" (vllm bench serve sends some of them).
_NEUTRAL = {"n": 1, "best_of": 1, "echo": False, "presence_penalty": 0, "frequency_penalty": 0,
            "repetition_penalty": 1, "logprobs": None, "top_logprobs": None, "stop": None,
            "logit_bias": None, "suffix": None, "min_tokens": 0, "parallel_tool_calls": None,
            "tools": None, "tool_choice": None, "response_format": None}
_PASSED = ("user", "metadata", "store", "service_tier")  # accepted and ignored, as OpenAI clients may send them
_SAMPLING = ("temperature", "top_p", "top_k", "seed", "ignore_eos")
_COMMON = {"model", "stream", "stream_options", "max_tokens", *_SAMPLING, *_NEUTRAL, *_PASSED}
COMPLETION_FIELDS = frozenset({"prompt", *_COMMON})
CHAT_FIELDS = frozenset({"messages", "max_completion_tokens", *_COMMON})
ROLES = ("system", "user", "assistant", "developer")


@dataclass
class Parsed:
    """A checked request: what goes to the engine, and how to answer."""

    model: str
    prompt: str | list[int]
    sampling: dict
    stream: bool
    include_usage: bool
    chat: bool


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _neutral(name: str, v, neutral) -> bool:
    """Whether a field we do not implement is given only with its 'off' value."""
    if v is None:
        return True
    if name == "stop":
        return v == [] or v == ""
    if name == "logprobs" and v is False:  # chat's boolean form
        return True
    if isinstance(neutral, bool) or isinstance(v, bool):
        return v is neutral
    return neutral is not None and _is_num(v) and v == neutral


def _check_common(body: dict, allowed: frozenset, served: str) -> tuple[dict, bool, bool]:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ProtocolError(f"unknown field {unknown[0]!r}; this server accepts: {', '.join(sorted(allowed))}",
                            unknown[0])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ProtocolError("'model' is required: a string naming the served model", "model")
    if model != served:
        raise ProtocolError(f"The model `{model}` does not exist; this server serves {served!r}", "model",
                            status=404, type_="NotFoundError")
    for name, neutral in _NEUTRAL.items():
        if name not in body:
            continue
        if not _neutral(name, body[name], neutral):
            raise ProtocolError(f"'{name}' is not supported by this engine (only {neutral!r} or null)", name)
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise ProtocolError(f"'stream' must be true or false, got {stream!r}", "stream")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict) or set(opts) - {"include_usage", "continuous_usage_stats"}:
            raise ProtocolError("'stream_options' must be an object with 'include_usage' (true or false)",
                                "stream_options")
        if not stream:
            raise ProtocolError("'stream_options' is allowed only with 'stream': true", "stream_options")
        include_usage = opts.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise ProtocolError("'stream_options.include_usage' must be true or false", "stream_options")
    sampling: dict = {}
    for name in ("temperature", "top_p"):
        v = body.get(name)
        if v is None:
            continue
        if not _is_num(v):
            raise ProtocolError(f"'{name}' must be a finite number, got {v!r}", name)
        sampling[name] = float(v)
    for name in ("top_k", "seed"):
        v = body.get(name)
        if v is None:
            continue
        if not _is_int(v):
            raise ProtocolError(f"'{name}' must be an integer, got {v!r}", name)
        sampling[name] = v
    if body.get("ignore_eos") is not None:
        if not isinstance(body["ignore_eos"], bool):
            raise ProtocolError(f"'ignore_eos' must be true or false, got {body['ignore_eos']!r}", "ignore_eos")
        sampling["ignore_eos"] = body["ignore_eos"]
    return sampling, bool(stream), include_usage


def _max_tokens(body: dict, names: tuple[str, ...]) -> int | None:
    for name in names:
        v = body.get(name)
        if v is None:
            continue
        if not _is_int(v) or v < 1:
            raise ProtocolError(f"'{name}' must be an integer >= 1, got {v!r}", name)
        return v
    return None


def parse_completion(body, served: str) -> Parsed:
    if not isinstance(body, dict):
        raise ProtocolError("the request body must be a JSON object")
    sampling, stream, usage = _check_common(body, COMPLETION_FIELDS, served)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise ProtocolError("'prompt' is empty", "prompt")
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        pass
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise ProtocolError("'prompt' holds several prompts; this server takes one per request", "prompt")
    else:
        raise ProtocolError("'prompt' must be a non-empty string or a non-empty list of token ids", "prompt")
    sampling["max_tokens"] = _max_tokens(body, ("max_tokens",)) or MAX_TOKENS_DEFAULT
    return Parsed(body["model"], prompt, sampling, stream, usage, chat=False)


def parse_chat(body, served: str) -> Parsed:
    if not isinstance(body, dict):
        raise ProtocolError("the request body must be a JSON object")
    sampling, stream, usage = _check_common(body, CHAT_FIELDS, served)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ProtocolError("'messages' must be a non-empty list of {role, content} objects", "messages")
    turns = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ProtocolError(f"messages[{i}] needs 'role', one of {', '.join(ROLES)}", "messages")
        content = m.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": "..."}]
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise ProtocolError(f"messages[{i}].content: only text parts are supported", "messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise ProtocolError(f"messages[{i}].content must be a string or a list of text parts", "messages")
        turns.append((m["role"], content))
    # Without max_tokens a chat request may run to the end of the context, as in vLLM: the
    # server sets it once the prompt is tokenized (`resolve_length`).
    sampling["max_tokens"] = _max_tokens(body, ("max_completion_tokens", "max_tokens"))
    return Parsed(body["model"], chat_prompt(turns), sampling, stream, usage, chat=True)


def resolve_length(p: Parsed, num_prompt_tokens: int, max_model_len: int) -> None:
    """Fill in a chat request's open max_tokens; refuse a request longer than the context."""
    if p.sampling["max_tokens"] is None:
        p.sampling["max_tokens"] = max(1, max_model_len - num_prompt_tokens)
    want = num_prompt_tokens + p.sampling["max_tokens"]
    if want > max_model_len:
        raise ProtocolError(f"This model's maximum context length is {max_model_len} tokens. However, you "
                            f"requested {want} tokens ({num_prompt_tokens} in the prompt, "
                            f"{p.sampling['max_tokens']} in the completion). Please reduce the length of the "
                            f"prompt or completion.", "prompt")


def chat_prompt(turns: list[tuple[str, str]]) -> str:
    """This server's chat template: one header per turn, then the assistant's header to continue from.

    A real model needs its own template (the tokenizer's chat_template, or vLLM's
    --chat-template); random weights have none, so any fixed format will do.
    """
    return "".join(f"<|{role}|>\n{content}\n" for role, content in turns) + "<|assistant|>\n"


# --- responses -------------------------------------------------------------------------


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def usage(prompt_tokens: int, completion_tokens: int, cached: int = 0) -> dict:
    u = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
         "total_tokens": prompt_tokens + completion_tokens}
    if cached:
        u["prompt_tokens_details"] = {"cached_tokens": cached}
    return u


def full_response(p: Parsed, rid: str, text: str, finish: str, u: dict) -> dict:
    if p.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": p.model, "choices": [choice],
            "usage": u}


def chunk(p: Parsed, rid: str, created: int, text: str | None, finish: str | None, role: bool = False) -> dict:
    """One SSE event's body. Chat streams open with a delta that carries only the role, as OpenAI's do."""
    if p.chat:
        delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text is not None else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": p.model, "choices": [choice]}


def usage_chunk(p: Parsed, rid: str, created: int, u: dict) -> dict:
    obj = "chat.completion.chunk" if p.chat else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": p.model, "choices": [], "usage": u}
