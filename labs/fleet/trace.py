"""The fleet's two workloads: a stored multi-turn chat trace, and a day-shaped load drawn from a seed.

Chat (labs/data/fleet_trace.yaml, `chat`): tenants, each with its own system prompt, behind one
preamble every tenant shares; conversations of several turns. Turn k's prompt is the preamble,
the tenant's system prompt, every earlier user message and reply, then the new user message, so
consecutive turns share everything but the newest tokens, as a chat API that resends the history
does. The next turn arrives a think time after the previous reply ends. The trace was drawn once
by `draw_chat` with the parameters stored beside it, and is stored so that a change to the drawing
code cannot change what the lab ran.

Token ids are placeholders that only have to be equal where the text is equal: every segment
(the preamble, a system prompt, one user message, one reply) gets its own range of integers.

Day (`day`): a Poisson process whose rate is a sinusoid over the compressed day plus one peak, each
request with its own prompt (no shared prefix): the autoscaler's load.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import yaml

from labs.serving_sim.trace import LengthRange
from labs.specs import SpecError

TRACE_PATH = Path(__file__).resolve().parents[1] / "data" / "fleet_trace.yaml"


@dataclass(frozen=True)
class Turn:
    user: int  # tokens of the new user message
    output: int  # tokens of the reply
    think_s: float  # seconds from the reply's last token to the next turn's arrival


@dataclass(frozen=True)
class Conversation:
    cid: int
    tenant: int
    start: float
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class ChatTrace:
    preamble: int
    tenants: tuple[int, ...]  # system-prompt tokens per tenant
    conversations: tuple[Conversation, ...]

    def limit(self, conversations: int) -> "ChatTrace":
        """The first `conversations` conversations (by start time): the tests' small trace."""
        kept = tuple(sorted(self.conversations, key=lambda c: (c.start, c.cid))[:conversations])
        return ChatTrace(self.preamble, self.tenants, kept)

    @property
    def turns(self) -> int:
        return sum(len(c.turns) for c in self.conversations)

    def longest(self) -> int:
        """Tokens of the longest turn: its whole history plus its reply."""
        best = 0
        for c in self.conversations:
            total = self.preamble + self.tenants[c.tenant]
            for t in c.turns:
                total += t.user + t.output
            best = max(best, total)
        return best


@dataclass(frozen=True)
class DayLoad:
    """Arrival rate over a compressed day: base + swing * (sinusoid, lowest at t = 0) + one Gaussian peak."""

    seconds: float
    base_rate: float  # requests/s
    swing: float  # requests/s above and below the base
    peak_at_s: float
    peak_rate: float  # requests/s added at the top of the peak
    peak_width_s: float
    prompt: LengthRange
    output: LengthRange
    seed: int

    def rate(self, t: float) -> float:
        wave = -math.cos(2 * math.pi * t / self.seconds)
        bump = math.exp(-((t - self.peak_at_s) / self.peak_width_s) ** 2)
        return max(0.0, self.base_rate + self.swing * wave + self.peak_rate * bump)

    @property
    def max_rate(self) -> float:
        return self.base_rate + self.swing + self.peak_rate

    def draw(self) -> list[tuple[float, int, int]]:
        """(arrival s, prompt tokens, output tokens), by thinning a Poisson process at the top rate."""
        rng = random.Random(self.seed)
        top, t, out = self.max_rate, 0.0, []
        while True:
            t += rng.expovariate(top)
            if t >= self.seconds:
                return out
            if rng.random() * top <= self.rate(t):
                out.append((t, self.prompt.draw(rng), self.output.draw(rng)))


def draw_chat(seed: int, tenants: int, conversations: int, preamble: int, system: LengthRange, turns: LengthRange,
              user: LengthRange, output: LengthRange, think_s: tuple[float, float], rate_per_s: float) -> ChatTrace:
    """A fresh chat trace from its parameters (what the stored file holds, drawn once)."""
    rng = random.Random(seed)
    systems = tuple(system.draw(rng) for _ in range(tenants))
    t, convs = 0.0, []
    for cid in range(conversations):
        t += rng.expovariate(rate_per_s)
        tenant = rng.randrange(tenants)
        convs.append(Conversation(cid, tenant, round(t, 3), tuple(
            Turn(user.draw(rng), output.draw(rng), round(rng.uniform(*think_s), 2)) for _ in range(turns.draw(rng)))))
    return ChatTrace(preamble, systems, tuple(convs))


def _int(value, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecError(f"{where}: expected a whole number >= 1, got {value!r}")
    return value


def _num(value, where: str, lo: float = 0.0) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < lo:
        raise SpecError(f"{where}: expected a finite number >= {lo:g}, got {value!r}")
    return float(value)


def _mapping(doc, key: str, fields: set[str], where: str) -> dict:
    section = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(section, dict):
        raise SpecError(f"{where}: needs a '{key}' mapping")
    unknown, missing = sorted(set(section) - fields), sorted(fields - set(section))
    if unknown or missing:
        raise SpecError(f"{where}: '{key}' " + (f"has unknown key(s) {unknown}" if unknown else f"lacks {missing}"))
    return section


def load(path: Path = TRACE_PATH) -> tuple[ChatTrace, DayLoad]:
    """Both workloads from the data file; a clear error naming the field for anything malformed."""
    where = str(path.name)
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        raise SpecError(f"{where}: cannot read it ({err})") from None
    chat = _mapping(doc, "chat", {"generator", "preamble_tokens", "tenants", "conversations"}, where)
    tenants = chat["tenants"]
    if not isinstance(tenants, list) or not tenants:
        raise SpecError(f"{where}: chat.tenants must be a list of system-prompt lengths")
    systems = tuple(_int(v, f"{where}: chat.tenants[{i}]") for i, v in enumerate(tenants))
    convs = []
    for i, row in enumerate(chat["conversations"] or []):
        at = f"{where}: chat.conversations[{i}]"
        if not (isinstance(row, list) and len(row) == 3 and isinstance(row[2], list) and row[2]):
            raise SpecError(f"{at}: expected [tenant, start_s, [[user, output, think_s], ...]]")
        tenant = row[0]
        if not isinstance(tenant, int) or isinstance(tenant, bool) or not 0 <= tenant < len(systems):
            raise SpecError(f"{at}: tenant must be an index into chat.tenants (0..{len(systems) - 1}), got {tenant!r}")
        turns = []
        for j, turn in enumerate(row[2]):
            if not (isinstance(turn, list) and len(turn) == 3):
                raise SpecError(f"{at}.turns[{j}]: expected [user_tokens, output_tokens, think_s]")
            turns.append(Turn(_int(turn[0], f"{at}.turns[{j}] user"), _int(turn[1], f"{at}.turns[{j}] output"),
                              _num(turn[2], f"{at}.turns[{j}] think_s")))
        convs.append(Conversation(i, tenant, _num(row[1], f"{at} start_s"), tuple(turns)))
    if not convs:
        raise SpecError(f"{where}: chat.conversations is empty")
    day = _mapping(doc, "day", {"seconds", "base_rate", "swing", "peak_at_s", "peak_rate", "peak_width_s",
                                "prompt_tokens", "output_tokens", "seed"}, where)
    try:
        prompt, output = LengthRange.parse(str(day["prompt_tokens"])), LengthRange.parse(str(day["output_tokens"]))
    except SpecError as err:
        raise SpecError(f"{where}: day: {err}") from None
    load_ = DayLoad(_num(day["seconds"], f"{where}: day.seconds", 1), _num(day["base_rate"], f"{where}: day.base_rate"),
                    _num(day["swing"], f"{where}: day.swing"), _num(day["peak_at_s"], f"{where}: day.peak_at_s"),
                    _num(day["peak_rate"], f"{where}: day.peak_rate"),
                    _num(day["peak_width_s"], f"{where}: day.peak_width_s", 1e-3), prompt, output,
                    int(_num(day["seed"], f"{where}: day.seed")))
    if load_.seed != day["seed"]:
        raise SpecError(f"{where}: day.seed must be a whole number >= 0, got {day['seed']!r}")
    if load_.swing > load_.base_rate:
        raise SpecError(f"{where}: day.swing ({load_.swing:g}) must not exceed day.base_rate ({load_.base_rate:g})")
    return ChatTrace(_int(chat["preamble_tokens"], f"{where}: chat.preamble_tokens"), systems, tuple(convs)), load_


def write_chat(trace: ChatTrace, generator: dict, day: dict, path: Path = TRACE_PATH) -> None:
    """Store a drawn chat trace and the day's parameters (run once, by hand, to make the data file)."""
    lines = ["# The fleet lab's workloads (python -m labs.fleet). The chat trace was drawn once by",
             "# labs.fleet.trace.draw_chat with the generator parameters below and is stored, so a change to",
             "# the drawing code cannot change what the lab ran. The day load is drawn from its seed at run time.",
             "chat:",
             f"  generator: {yaml.safe_dump(generator, default_flow_style=True, width=1000).strip()}",
             f"  preamble_tokens: {trace.preamble}  # shared by every tenant",
             f"  tenants: {list(trace.tenants)}  # system-prompt tokens per tenant",
             "  # [tenant, start s, [[user tokens, reply tokens, think s before the next turn], ...]]",
             "  conversations:"]
    for c in trace.conversations:
        turns = ", ".join(f"[{t.user}, {t.output}, {t.think_s:g}]" for t in c.turns)
        lines.append(f"    - [{c.tenant}, {c.start:g}, [{turns}]]")
    lines += ["# Compressed day: rate(t) = base_rate + swing * -cos(2 pi t / seconds) + peak_rate *",
              "# exp(-((t - peak_at_s) / peak_width_s)^2) requests/s; lengths uniform in LO:HI.",
              "day:"] + [f"  {k}: {v!r}" if not isinstance(v, str) else f"  {k}: '{v}'" for k, v in day.items()]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
