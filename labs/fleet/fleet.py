"""N replicas of the engine's scheduler on one simulated clock, a router in front, an autoscaler above.

Each `Replica` is what one GPU runs: `labs.engine.scheduler.Scheduler` with its own
`BlockManager` (prefix caching on, so each replica has its own cache, as each vLLM instance
does) and its own calibrated roofline clock. Nothing here decides which tokens run: the
engine's scheduler does, exactly as on a GPU.

`Fleet.run` is a discrete-event loop over four kinds of event, earliest first:

* a replica's step ends: its tokens are stamped at that time, finished requests leave, and
  if it still has work its next step starts at once (its cost sets the next end);
* a request arrives: the router picks one of the ready replicas and it joins that
  replica's waiting queue (an idle replica starts a step);
* a replica finishes loading the model (`cold_start_s` after the autoscaler asked for it)
  and becomes ready;
* the autoscaler's control tick: it reads each replica's `num_requests_waiting`,
  `num_requests_running` and GPU utilisation (the fraction of the last period during which a
  step ran, which is what nvidia-smi and DCGM report: time with a kernel running, not how
  full the batch was), and adds or drains replicas.

A draining replica takes no new requests, finishes what it holds, then gives its GPU back.
GPU time counts from the request for a replica (loading included) to its release.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import math
from dataclasses import dataclass, field

from labs.engine.block_manager import BlockManager
from labs.engine.config import EngineConfig
from labs.engine.scheduler import Scheduler
from labs.engine.sequence import SamplingParams, Sequence
from labs.serving_sim.clock import RooflineClock
from labs.serving_sim.cost import Roofline
from labs.specs import SpecError


class Replica:
    """One engine instance: scheduler, block manager, clock, and its lifecycle in the fleet."""

    def __init__(self, index: int, cost: Roofline, cfg: EngineConfig, now: float, ready_at: float,
                 prefix_caching: bool):
        self.index = index
        self.blocks = BlockManager(cfg.usable_blocks + 1, cfg.block_size, enable_prefix_caching=prefix_caching)
        self.clock = RooflineClock(cost, now)
        self.sched = Scheduler(cfg, self.blocks, self.clock, with_block_ids=False)
        self.created, self.ready_at = now, ready_at
        self.state = "ready" if ready_at <= now else "loading"
        self.released: float | None = None
        self.out = None  # the step in flight
        self.end: float | None = None  # when it ends
        self.busy_s = 0.0  # seconds of steps started so far (a step counts whole when it starts)
        self.steps = 0

    @property
    def load(self) -> int:
        """Requests it holds: vllm:num_requests_running + vllm:num_requests_waiting."""
        return len(self.sched.running) + len(self.sched.waiting)

    def start(self, now: float) -> bool:
        """Schedule the next step at `now`; False when there is nothing to run."""
        self.clock.now = now
        for _ in range(4):  # a step that only preempted is followed by one that runs
            if not self.sched.has_work():
                break
            out = self.sched.schedule()
            if out.chunks:
                dt = self.clock.step_time(out)
                self.out, self.end = out, now + dt
                self.busy_s += dt
                self.steps += 1
                return True
        self.out = self.end = None
        return False

    def finish_step(self, tokens_for) -> list[Sequence]:
        """End the step in flight: stamp its tokens at its end time, return the requests that finished."""
        self.clock.now = self.end
        out = self.out
        finished = self.sched.update(out, [tokens_for(c.seq) if c.samples else None for c in out.chunks])
        return finished


# --- routers -----------------------------------------------------------------------------


class RoundRobin:
    """The next replica in turn, whatever it holds (vLLM production-stack's `roundrobin`)."""

    name = "round-robin"

    def __init__(self):
        self.turn = 0

    def pick(self, seq: Sequence, key: int, replicas: list[Replica]) -> Replica:
        r = replicas[self.turn % len(replicas)]
        self.turn += 1
        return r


class LeastLoaded:
    """The replica holding the fewest requests (running + waiting)."""

    name = "least-loaded"

    def pick(self, seq, key, replicas):
        return min(replicas, key=lambda r: (r.load, r.index))


class Session:
    """Every turn of a conversation to the same replica, by rendezvous hashing of its id (sticky sessions)."""

    name = "session"

    def pick(self, seq, key, replicas):
        def weight(r: Replica) -> bytes:
            return hashlib.blake2b(f"{key}/{r.index}".encode(), digest_size=8).digest()
        return max(replicas, key=weight)


MIN_BOUND = 8  # requests a replica may always hold before the prefix router looks elsewhere


# --8<-- [start:prefix_router]
class PrefixAware:
    """The replica whose cache holds the longest prefix of the request, among those under a load bound.

    The bound is consistent hashing with bounded loads: a replica may take the request only while
    it holds fewer than ceil(cap x (requests in the fleet + 1) / replicas), or fewer than MIN_BOUND
    (a replica that light is never the hot spot). Without it every turn of a popular tenant would
    pile onto the one replica that cached its system prompt first.
    Ties (the same cached length) go to the less loaded replica.
    """

    name = "prefix-aware"

    def __init__(self, load_cap: float = 1.25):
        if not load_cap >= 1:
            raise SpecError(f"the prefix router's load cap must be >= 1, got {load_cap}")
        self.load_cap = load_cap

    def pick(self, seq, key, replicas):
        bound = max(MIN_BOUND, math.ceil(self.load_cap * (sum(r.load for r in replicas) + 1) / len(replicas)))
        allowed = [r for r in replicas if r.load < bound] or replicas
        return max(allowed, key=lambda r: (len(r.blocks.lookup(seq)), -r.load, -r.index))
# --8<-- [end:prefix_router]


ROUTERS = {"round-robin": RoundRobin, "least-loaded": LeastLoaded, "session": Session, "prefix-aware": PrefixAware}


# --- autoscaler ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Autoscaler:
    """A Kubernetes-HPA-shaped controller: every `period_s`, desired = f(signal); scale-down waits.

    policy "queue": desired = ceil((num_requests_running + num_requests_waiting) / target_running),
    summed over ready replicas. Running saturates at what a replica admits, so past capacity only
    the waiting term grows, and it says how many replicas are missing.
    policy "util": desired = ceil(ready x mean GPU utilisation / util_target), the HPA formula on
    a utilisation target. Utilisation cannot exceed 1, so one tick adds at most a factor of
    1 / util_target, however long the queue.
    Both skip changes within `tolerance` of 1 (HPA's default 0.1), clamp to [min, max], and scale
    down only to the highest recommendation of the last `stabilization_s` (HPA's scale-down window).
    """

    policy: str
    period_s: float = 15.0
    cold_start_s: float = 60.0
    stabilization_s: float = 120.0
    min_replicas: int = 1
    max_replicas: int = 16
    target_running: int = 64
    util_target: float = 0.9
    tolerance: float = 0.1

    def __post_init__(self):
        if self.policy not in ("queue", "util"):
            raise SpecError(f"autoscaler policy must be 'queue' or 'util', got {self.policy!r}")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise SpecError(f"need 1 <= min_replicas <= max_replicas, got {self.min_replicas}, {self.max_replicas}")
        if not 0 < self.util_target <= 1 or self.target_running < 1:
            raise SpecError("util_target must be in (0, 1] and target_running >= 1")

    # --8<-- [start:desired]
    def desired(self, ready: list[Replica], utils: list[float]) -> int:
        n = len(ready)
        if n == 0:
            return self.min_replicas
        if self.policy == "queue":
            load = sum(len(r.sched.running) + len(r.sched.waiting) for r in ready)
            ratio = load / (self.target_running * n)
        else:
            ratio = (sum(utils) / n) / self.util_target
        if abs(ratio - 1) <= self.tolerance:
            return n
        return max(self.min_replicas, min(self.max_replicas, math.ceil(n * ratio)))
    # --8<-- [end:desired]


@dataclass
class Tick:
    t: float
    ready: int
    loading: int
    waiting: int
    running: int
    util: float  # mean over ready replicas
    desired: int


@dataclass
class RunResult:
    requests: list[Sequence]
    replica_of: dict[int, int]
    replicas: list[Replica]
    end_time: float
    ticks: list[Tick] = field(default_factory=list)

    def gpu_seconds(self) -> float:
        return sum((r.released if r.released is not None else self.end_time) - r.created for r in self.replicas)


class Fleet:
    """Replicas, a router, optionally an autoscaler, and the event loop that runs a workload through them."""

    def __init__(self, cost: Roofline, cfg: EngineConfig, router, replicas: int, prefix_caching: bool = True,
                 autoscaler: Autoscaler | None = None):
        if replicas < 1:
            raise SpecError(f"a fleet needs at least one replica, got {replicas}")
        self.cost, self.cfg, self.router, self.autoscaler = cost, cfg, router, autoscaler
        self.prefix_caching = prefix_caching
        self.replicas = [Replica(i, cost, cfg, 0.0, 0.0, prefix_caching) for i in range(replicas)]
        self._events: list = []
        self._order = itertools.count()

    def _push(self, t: float, kind: int, payload) -> None:
        heapq.heappush(self._events, (t, kind, next(self._order), payload))

    def _start(self, r: Replica, now: float) -> None:
        if r.end is None and r.start(now):
            self._push(r.end, 0, r)

    def _add_replica(self, now: float) -> Replica:
        ready_at = now + (self.autoscaler.cold_start_s if self.autoscaler else 0.0)
        r = Replica(len(self.replicas), self.cost, self.cfg, now, ready_at, self.prefix_caching)
        self.replicas.append(r)
        self._push(ready_at, 1, r)
        return r

    def _release_if_drained(self, r: Replica, now: float) -> None:
        if r.state == "draining" and r.end is None and not r.sched.has_work():
            r.state, r.released = "released", now

    def run(self, arrivals: list[tuple[float, Sequence, int]], tokens_for, on_finish=None,
            until: float | None = None, stop: float | None = None) -> RunResult:
        """Run every arrival (time, sequence, routing key) to completion (or, for a test, up to `stop` s).

        tokens_for(seq) gives the token a sampling step appends (the trace's reply, so the next
        turn's prompt matches what was cached); on_finish(seq, t) may return further arrivals.
        """
        for t, seq, key in arrivals:
            self._push(t, 2, (seq, key))
        done: list[Sequence] = []
        replica_of: dict[int, int] = {}
        ticks: list[Tick] = []
        a = self.autoscaler
        if a is not None:
            self._push(a.period_s, 3, None)
        history: list[tuple[float, int]] = []
        last_busy = {r.index: 0.0 for r in self.replicas}
        now = 0.0
        steps_left = 50_000_000
        while self._events:
            if stop is not None and self._events[0][0] > stop:
                break
            now, kind, _, payload = heapq.heappop(self._events)
            steps_left -= 1
            if steps_left < 0:
                raise RuntimeError("fleet simulation exceeded its event bound; this is a bug")
            if kind == 0:  # a step ends
                r = payload
                for seq in r.finish_step(tokens_for):
                    done.append(seq)
                    if on_finish is not None:
                        for t, nxt, key in on_finish(seq, now):
                            self._push(t, 2, (nxt, key))
                r.end = None
                self._start(r, now)
                self._release_if_drained(r, now)
            elif kind == 1:  # a replica finished loading
                if payload.state == "loading":
                    payload.state = "ready"
                    last_busy[payload.index] = payload.busy_s
            elif kind == 2:  # an arrival
                seq, key = payload
                ready = [r for r in self.replicas if r.state == "ready"]
                if not ready:
                    raise SpecError("no ready replica to route a request to")
                r = self.router.pick(seq, key, ready)
                replica_of[seq.seq_id] = r.index
                r.sched.add(seq)
                self._start(r, now)
            else:  # the autoscaler's tick
                ready = [r for r in self.replicas if r.state == "ready"]
                loading = [r for r in self.replicas if r.state == "loading"]
                utils = [min(1.0, (r.busy_s - last_busy[r.index]) / a.period_s) for r in ready]
                for r in self.replicas:
                    last_busy[r.index] = r.busy_s
                want = a.desired(ready, utils)
                history.append((now, want))
                history = [(t, w) for t, w in history if t > now - a.stabilization_s]
                have = len(ready) + len(loading)
                if want > have:
                    for _ in range(want - have):
                        r = self._add_replica(now)
                        last_busy[r.index] = 0.0
                else:
                    floor = max(w for _, w in history)
                    for r in sorted(ready, key=lambda r: (r.load, -r.index))[:max(0, have - floor)]:
                        if len([x for x in self.replicas if x.state == "ready"]) <= a.min_replicas:
                            break
                        r.state = "draining"
                        self._release_if_drained(r, now)
                ticks.append(Tick(now, len(ready), len(loading), sum(len(r.sched.waiting) for r in ready),
                                  sum(len(r.sched.running) for r in ready),
                                  sum(utils) / len(utils) if utils else 0.0, want))
                more = any(k == 2 for _, k, _, _ in self._events) or any(r.end is not None for r in self.replicas)
                if more or (until is not None and now + a.period_s <= until):
                    self._push(now + a.period_s, 3, None)
        end = max(now, until or 0.0)
        for r in self.replicas:
            if r.state == "draining" and r.released is None:
                r.released = now
        return RunResult(done, replica_of, self.replicas, end, ticks)


def new_sequence(seq_id: int, prompt: list[int], output_len: int, arrival: float) -> Sequence:
    return Sequence(seq_id, prompt, SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True),
                    arrival=arrival)
