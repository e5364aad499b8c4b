"""The engine in its own thread, and the asyncio side that feeds it requests and reads its tokens.

Why a separate thread: `LLM.step()` blocks for a whole forward pass (milliseconds at 8B
shapes). Run on the event loop, it would stall every socket for that long: no new request
accepted, no token flushed, no disconnect noticed. In its own thread the step's GPU work
and its device sync run with the GIL released (torch drops it inside kernels and while
waiting), so the loop keeps serving HTTP meanwhile. What still shares the GIL is the
Python around the step: the scheduler's bookkeeping here, JSON and SSE encoding there.

vLLM 0.33 goes one step further and puts the engine core in another *process*
(`EngineCoreProc` in vllm/v1/engine/core.py, reached over ZMQ by `AsyncMPClient` in
vllm/v1/engine/core_client.py): tokenization, detokenization and HTTP in the API server
then never take the GIL from the scheduler loop, and with data parallelism each rank gets
its own engine-core process behind the same API servers. A thread is the smaller version
of the same split, with the same shape: the engine side sees only token ids, and the API
side (this module's `EngineClient`, like vLLM's `AsyncLLM` with its `OutputProcessor`)
turns them into text.

The two sides share nothing mutable but two queues. The loop sends commands (`add`,
`abort`) through a thread-safe queue and wakes the engine; after every step the engine
thread posts each live request's new token ids to that request's asyncio.Queue with
`loop.call_soon_threadsafe`. Only the engine thread ever touches the scheduler.

Abort on disconnect: when the HTTP handler's task is cancelled (the client went away),
`EngineClient.generate` catches the cancellation and sends `abort`; the engine thread then
calls `LLM.abort`, which frees the request's KV blocks before the next step. vLLM 0.33
does the same in `AsyncLLM.generate` (vllm/v1/engine/async_llm.py: `except
(asyncio.CancelledError, GeneratorExit)` then `self.abort(...)`), fed by
`with_cancellation` / `listen_for_disconnect` (vllm/entrypoints/serve/utils/api_utils.py)
for whole responses and by Starlette's StreamingResponse for streams.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field

from labs.server.metrics import Metrics


@dataclass
class Event:
    """What the engine thread posts for one request: new token ids, and the end when it comes."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop", "length", "abort"
    error: str | None = None  # the request was refused (a 400) or the engine died (a 500)
    engine_dead: bool = False
    accepted: bool = False  # first event of a valid request: it is queued in the scheduler
    prompt_tokens: int = 0
    cached_tokens: int = 0


class _Stream:
    """One request as the engine thread tracks it."""

    __slots__ = ("prompt", "params", "loop", "queue", "seq", "sent", "aborted")

    def __init__(self, prompt, params, loop: asyncio.AbstractEventLoop):
        self.prompt = prompt
        self.params = params
        self.loop = loop
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.seq = None
        self.sent = 0  # output tokens already posted
        self.aborted = False

    def post(self, event: Event) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


class EngineThread:
    """Owns an LLM and runs its step loop; every other thread talks to it through `submit`."""

    def __init__(self, llm, metrics: Metrics):
        self.llm = llm
        self.metrics = metrics
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._live: dict[int, _Stream] = {}
        self._stop = False
        self.error: str | None = None  # set when a step raised: the engine is dead
        self.steps = 0
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    # --- any thread ----------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self.error is None and self._thread.is_alive()

    def submit(self, command: str, stream: _Stream) -> None:
        self._commands.put((command, stream))
        self._wake.set()

    def gauges(self) -> dict[str, float]:
        """Read at scrape time from the engine's own counters (ints and list lengths: safe under the GIL)."""
        s, b = self.llm.scheduler, self.llm.blocks
        usable = b.num_usable
        return {"vllm:num_requests_running": len(s.running), "vllm:num_requests_waiting": len(s.waiting),
                "vllm:kv_cache_usage_perc": (usable - b.num_free) / usable if usable else 0.0}

    # --- the engine thread -----------------------------------------------------------

    def _run(self) -> None:
        while not self._stop:
            self._drain()
            if not self.llm.scheduler.has_work():
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                before = self.llm.scheduler.preemptions
                finished = self.llm.step()
            except Exception:  # the engine is dead: fail every request, /health says 503
                self.error = traceback.format_exc(limit=3)
                for st in self._live.values():
                    st.post(Event(error="the engine failed while running this request", engine_dead=True))
                self._live.clear()
                return
            self.steps += 1
            if self.llm.steps:
                self.metrics.observe("vllm:iteration_tokens_total", self.llm.steps[-1].num_tokens)
                if len(self.llm.steps) > 1024:  # the LLM keeps every step; a server must not
                    del self.llm.steps[:-1]
            if self.llm.scheduler.preemptions != before:
                self.metrics.inc("vllm:num_preemptions", self.llm.scheduler.preemptions - before)
            self._publish({s.seq_id for s in finished})

    def _drain(self) -> None:
        while True:
            try:
                command, st = self._commands.get_nowait()
            except queue.Empty:
                return
            if command == "add":
                if st.aborted:  # gone before it was queued
                    continue
                seq, out = self.llm.add_request(st.prompt, st.params)
                if seq is None:
                    st.post(Event(error=out.error))
                    continue
                st.seq = seq
                self._live[seq.seq_id] = st
                st.post(Event(accepted=True, prompt_tokens=seq.num_prompt_tokens))
            elif command == "abort":
                st.aborted = True
                seq = st.seq
                if seq is not None and self._live.pop(seq.seq_id, None) is not None:
                    # Frees its blocks now. No finished-request metric, as in vLLM 0.33: a client's
                    # disconnect aborts internally and OutputProcessor.abort_requests drops the request
                    # before its stats are recorded (vllm/v1/engine/output_processor.py).
                    self.llm.abort(seq)

    def _publish(self, finished_ids: set[int]) -> None:
        now = time.perf_counter()
        for sid, st in list(self._live.items()):
            seq = st.seq
            n = seq.num_output
            done = sid in finished_ids
            if n == st.sent and not done:
                continue
            new = seq.token_ids[seq.num_prompt_tokens + st.sent:]
            if st.sent == 0 and n and seq.first_token_time is not None:
                # At the first token, as vLLM's output processor does: a histogram fed at the finish
                # would lag the queue by a whole request and miss requests still running.
                self.metrics.observe("vllm:time_to_first_token_seconds", seq.first_token_time - seq.arrival)
            st.sent = n
            if not done:
                st.post(Event(new))
                continue
            del self._live[sid]
            st.post(Event(new, finish_reason=seq.finish_reason, prompt_tokens=seq.num_prompt_tokens,
                          cached_tokens=seq.num_cached_tokens))
            self._record_finished(seq, now)

    def _record_finished(self, seq, now: float) -> None:
        m = self.metrics
        m.inc("vllm:request_success", finished_reason=seq.finish_reason or "stop")
        m.inc("vllm:prompt_tokens", seq.num_prompt_tokens)
        m.inc("vllm:prompt_tokens_cached", seq.num_cached_tokens)
        m.inc("vllm:generation_tokens", seq.num_output)
        m.observe("vllm:request_prompt_tokens", seq.num_prompt_tokens)
        m.observe("vllm:request_generation_tokens", seq.num_output)
        times = seq.token_times
        if seq.first_token_time is not None:
            m.observe("vllm:e2e_request_latency_seconds", (seq.finish_time or now) - seq.arrival)
        for a, b in zip(times, times[1:]):
            m.observe("vllm:inter_token_latency_seconds", b - a)
        if len(times) > 1:
            m.observe("vllm:request_time_per_output_token_seconds", (times[-1] - times[0]) / (len(times) - 1))


class EngineClient:
    """The asyncio side: `generate` yields Events for one request and aborts it if cancelled."""

    def __init__(self, engine: EngineThread):
        self.engine = engine
        self.in_flight = 0  # accepted and not yet finished: what admission control counts

    async def generate(self, prompt, params):
        st = _Stream(prompt, params, asyncio.get_running_loop())
        self.in_flight += 1
        finished = False
        try:
            self.engine.submit("add", st)
            while True:
                ev = await st.queue.get()
                if ev.error is not None or ev.finish_reason is not None:
                    finished = True
                yield ev
                if finished:
                    return
        finally:
            self.in_flight -= 1
            if not finished:  # cancelled (client gone) or the consumer stopped early
                self.engine.submit("abort", st)
