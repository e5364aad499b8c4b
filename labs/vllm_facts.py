"""The vLLM facts file (labs/data/vllm.yaml): loading, lookups, and errors that name the fix.

Every vLLM name the site states (a flag and its default, a metric, an endpoint, an
environment variable, a request field, a method or backend name) is read from one
file, pinned to one vLLM version. Pages read it through macros.py, the labs can read
it here, tests/test_vllm_facts.py checks each entry against an installed vLLM, and
tests/test_content_lint.py fails on any name a page states that the file lacks.

Lookups raise `FactError` with the section searched and the closest known names, so
a typo in a page fails the build with a message that says what was meant.

Standard library and PyYAML only: the site build and the lint must not need vLLM or
torch.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

from labs import datafile

FACTS_FILE = Path(__file__).resolve().parent / "data" / "vllm.yaml"

# Sections of the file, in the order the reference page lists them.
SECTIONS = (
    "engine_args",
    "server_args",
    "bench_args",
    "batch_defaults",
    "metrics",
    "endpoints",
    "env_vars",
    "request_fields",
    "speculative_methods",
    "quantization_methods",
    "structured_output_backends",
    "kernel_constants",
    "removed",
)

# The two entry points whose batch defaults differ, by the names vLLM's
# UsageContext gives them (vllm/usage/usage_lib.py), and the names pages use.
USAGE_CONTEXTS = {
    "vllm serve": "OPENAI_API_SERVER",
    "OPENAI_API_SERVER": "OPENAI_API_SERVER",
    "LLM": "LLM_CLASS",
    "LLM_CLASS": "LLM_CLASS",
}

# Prometheus exposes a counter `x` as `x_total` and a histogram `x` as
# `x_bucket`, `x_sum` and `x_count` (prometheus_client; `_created` for both).
_METRIC_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": (),
}

_PATH_PARAM_RE = re.compile(r"\{[^}/]+\}")

GIB = 2**30


class FactError(KeyError):
    """A name that the facts file does not hold, or holds as removed."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0])


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


# ---------------------------------------------------------------------------
# The file's shape. Loading checks every entry against these records, so a typo'd
# key or a number where text belongs (`version: 0.33` reads as a float) fails with
# its line; lookups then read the plain mapping.
# ---------------------------------------------------------------------------

Scalar = Union[bool, int, datafile.FLOAT_OR_INF, str, None]


@dataclass(frozen=True)
class _Arg:
    flag: str
    default: Union[Scalar, dict[str, Scalar]]  # a mapping for a config object: the fields pages name
    meaning: str
    source: str
    aliases: tuple[str, ...] = ()
    hidden_aliases: tuple[str, ...] = ()
    abbreviations: tuple[str, ...] = ()
    cli_default: Scalar = None
    config: str | None = None
    config_default: Scalar = None
    llm_default: Scalar = None
    choices: tuple[Scalar, ...] = ()
    resolved: Scalar = None
    resolved_for: dict[str, str] | None = None
    resolved_how: str | None = None

    def __post_init__(self):
        if not self.flag.startswith("--"):
            raise ValueError(f"flag must start with '--', got {self.flag!r}")


@dataclass(frozen=True)
class _Limits:
    max_num_batched_tokens: int
    max_num_seqs: int


@dataclass(frozen=True)
class _Tier:
    min_memory_gib: float
    OPENAI_API_SERVER: _Limits
    LLM_CLASS: _Limits
    exclude_device_names: tuple[str, ...] = ()
    exclude_capabilities: tuple[str, ...] = ()


@dataclass(frozen=True)
class _BatchDefaults:
    source: str
    tiers: tuple[_Tier, ...]
    fallback: _Limits


@dataclass(frozen=True)
class _BenchFlag:
    default: Scalar
    meaning: str


@dataclass(frozen=True)
class _Bench:
    module: str
    source: str
    flags: dict[str, _BenchFlag]
    engine_flags: bool = False
    builder: str | None = None


@dataclass(frozen=True)
class _Metric:
    type: Literal["counter", "gauge", "histogram"]
    meaning: str
    source: str
    labels: tuple[str, ...] | None = None
    when: str | None = None


@dataclass(frozen=True)
class _Endpoint:
    methods: tuple[Literal["GET", "POST", "PUT", "DELETE", "PATCH"], ...]
    api_key: bool
    meaning: str
    source: str
    requires: dict[str, str] | None = None


@dataclass(frozen=True)
class _Prefixes:
    prefixes: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class _EnvVar:
    default: Scalar
    meaning: str
    source: str


@dataclass(frozen=True)
class _RequestClass:
    module: str
    source: str


@dataclass(frozen=True)
class _RequestField:
    defaults: dict[str, Union[Scalar, tuple[Scalar, ...]]]  # a list default: `stop` is []
    meaning: str


@dataclass(frozen=True)
class _Named:
    meaning: str
    source: str


@dataclass(frozen=True)
class _Constant:
    module: str
    value: Union[int, float]
    meaning: str
    source: str


@dataclass(frozen=True)
class _Removed:
    kind: str
    note: str
    replaced_by: str
    evidence: str
    removed_in: str | None = None
    python_name: str | None = None


@dataclass(frozen=True)
class _FactsFile:
    version: str
    engine: str
    engine_args: dict[str, _Arg]
    server_args: dict[str, _Arg]
    bench_args: dict[str, _Bench]
    batch_defaults: _BatchDefaults
    metrics: dict[str, _Metric]
    endpoints: dict[str, _Endpoint]
    api_key_prefixes: _Prefixes
    env_vars: dict[str, _EnvVar]
    request_classes: dict[str, _RequestClass]
    request_fields: dict[str, _RequestField]
    speculative_methods: dict[str, _Named]
    quantization_methods: dict[str, _Named]
    structured_output_backends: dict[str, _Named]
    kernel_constants: dict[str, _Constant]
    removed: dict[str, _Removed]


@functools.lru_cache(maxsize=4)
def _load_cached(path: str, mtime_ns: int) -> dict[str, Any]:
    shown = "labs/data/vllm.yaml" if Path(path) == FACTS_FILE else path
    try:
        doc = datafile.load(path, shown)
        datafile.build(_FactsFile, doc.data, doc)
    except datafile.DataError as exc:
        raise FactError(str(exc)) from None
    return doc.data


def load(path: str | Path = FACTS_FILE) -> dict[str, Any]:
    """The facts file as a dict, reread when it changes (so `mkdocs serve` sees edits)."""
    path = Path(path)
    return _load_cached(str(path), path.stat().st_mtime_ns)


def version(facts: dict[str, Any] | None = None) -> str:
    return str((facts or load())["version"])


def section(name: str, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    facts = facts or load()
    return facts.get(name) or {}


def _unknown(kind: str, name: str, known: list[str], facts: dict[str, Any]) -> FactError:
    """The error for a name the file lacks: removed names get their own message."""
    gone = removed_entry(name, facts)
    if gone is not None:
        when = f"in vLLM {gone['removed_in']}" if gone.get("removed_in") else "before vLLM " + version(facts)
        return FactError(
            f"{kind} {name!r} was removed {when} ({gone.get('note', '').strip()}). "
            f"Name it only through removed({name!r}, ...), or use what replaced it"
            + (f": {gone['replaced_by']}" if gone.get("replaced_by") else ".")
        )
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return FactError(
        f"{kind} {name!r} is not in labs/data/vllm.yaml (vLLM {version(facts)}).{hint} "
        f"Check it in vLLM's source at that version and add an entry citing the source."
    )


# ---------------------------------------------------------------------------
# Arguments (engine, server, benchmark CLIs)
# ---------------------------------------------------------------------------


def arg(name: str, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """An engine or server argument by its Python name (`gpu_memory_utilization`)."""
    facts = facts or load()
    for sec in ("engine_args", "server_args"):
        entry = section(sec, facts).get(name)
        if entry is not None:
            return entry
    known = [*section("engine_args", facts), *section("server_args", facts)]
    return _raise(_unknown("vLLM argument", name, known, facts))


def arg_section(name: str, facts: dict[str, Any] | None = None) -> str:
    facts = facts or load()
    for sec in ("engine_args", "server_args"):
        if name in section(sec, facts):
            return sec
    return _raise(_unknown("vLLM argument", name, [], facts))


def serve_flags(facts: dict[str, Any] | None = None) -> dict[str, str]:
    """Every `vllm serve` spelling the file holds (aliases, hidden ones, abbreviations) -> its Python name."""
    facts = facts or load()
    out: dict[str, str] = {}
    for sec in ("engine_args", "server_args"):
        for name, entry in section(sec, facts).items():
            spellings = [entry["flag"], *entry.get("aliases", []), *entry.get("hidden_aliases", []),
                         *entry.get("abbreviations", [])]
            for flag in spellings:
                out[flag] = name
    return out


def api_key_prefixes(facts: dict[str, Any] | None = None) -> list[str]:
    """Path prefixes the API key guards; every other path answers without a key."""
    return list((section("api_key_prefixes", facts or load()) or {}).get("prefixes", []))


def bench_flags(command: str, facts: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Flags of one `vllm bench <command>` (e.g. 'serve') the file holds, by flag."""
    facts = facts or load()
    bench = section("bench_args", facts).get(command)
    if bench is None:
        known = list(section("bench_args", facts))
        raise FactError(
            f"`vllm bench {command}` has no entry in bench_args of labs/data/vllm.yaml (known: {known}); "
            "add the command and its flags, citing vllm/benchmarks/<command>.py"
        )
    return bench["flags"]


def resolved_default(name: str, facts: dict[str, Any] | None = None) -> Any:
    """What vLLM uses when the argument is not given: `resolved` where recorded, else the raw default.

    Where the value depends on the GPU or the entry point, `resolved` is the one for
    `resolved_for` (the site's reference deployment) and `batch_default` gives the others.
    """
    entry = arg(name, facts)
    return entry["resolved"] if "resolved" in entry else entry["default"]


def batch_default(
    name: str,
    memory_bytes: int,
    device_name: str = "",
    usage_context: str = "vllm serve",
    capability: str | None = None,
    facts: dict[str, Any] | None = None,
) -> int:
    """max_num_batched_tokens / max_num_seqs before the per-model adjustments, for one GPU and entry point.

    Mirrors EngineArgs.get_batch_defaults (vllm/engine/arg_utils.py) from the
    `batch_defaults` table: the first tier whose memory floor the GPU's
    driver-reported total reaches, unless its name or compute capability is
    excluded from that tier. Other usage contexts get the fallback.
    """
    facts = facts or load()
    table = section("batch_defaults", facts)
    if name not in table.get("fallback", {}):
        raise FactError(f"batch_default: {name!r} is not a batch default (known: {sorted(table['fallback'])})")
    if usage_context not in USAGE_CONTEXTS:
        raise FactError(f"batch_default: entry point {usage_context!r} is not one of {sorted(USAGE_CONTEXTS)}")
    context = USAGE_CONTEXTS[usage_context]
    lowered = device_name.lower()
    for tier in table["tiers"]:
        if memory_bytes < tier["min_memory_gib"] * GIB:
            continue
        if any(word in lowered for word in tier.get("exclude_device_names", [])):
            continue
        if capability is not None and capability in tier.get("exclude_capabilities", []):
            continue
        return int(tier[context][name])
    raise FactError("batch_defaults.tiers has no tier for this GPU: the last tier must have min_memory_gib: 0")


def kernel_constant(name: str, facts: dict[str, Any] | None = None) -> int | float:
    """A constant of vLLM's kernels or backends (`MIN_LAUNCH_GRID_SIZE_2D`), as the file records it."""
    facts = facts or load()
    entry = section("kernel_constants", facts).get(name)
    if entry is None:
        return _raise(_unknown("vLLM kernel constant", name, list(section("kernel_constants", facts)), facts))
    return entry["value"]


def gpu_batch_default(name: str, gpu: Any, usage_context: str = "vllm serve") -> int:
    """batch_default for a GPU of labs/data (a specs.GPUSpec), read as vLLM reads the device.

    On CUDA, vLLM's platform asks NVML: the memory is NVML's total, nvidia-smi's figure
    (memory_mib_reported, not the smaller cudaMemGetInfo total), and the name NVML's
    ("NVIDIA H200", cuda_name; the display name where none is recorded). Every caller
    goes through here so the KV budget, the simulator and the pages pick the same tier.
    """
    return batch_default(name, gpu.memory_bytes_reported, gpu.cuda_name or gpu.display_name, usage_context)


# ---------------------------------------------------------------------------
# Metrics, endpoints, environment variables, request fields
# ---------------------------------------------------------------------------


def metric_base(name: str, facts: dict[str, Any] | None = None) -> str | None:
    """The registered metric a name refers to: itself, or the metric behind an exposition suffix."""
    metrics = section("metrics", facts or load())
    if name in metrics:
        return name
    for base, entry in metrics.items():
        for suffix in _METRIC_SUFFIXES.get(entry["type"], ()):
            if name == base + suffix:
                return base
    return None


def metric(name: str, facts: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    facts = facts or load()
    base = metric_base(name, facts)
    if base is None:
        return _raise(_unknown("vLLM metric", name, list(section("metrics", facts)), facts))
    return base, section("metrics", facts)[base]


def normalize_path(path: str) -> str:
    """'/v1/responses/resp_123' and '/v1/responses/{id}' both match '/v1/responses/{response_id}'."""
    return _PATH_PARAM_RE.sub("{}", path.split("?", 1)[0].rstrip("/") or "/")


def endpoint_key(path: str, facts: dict[str, Any] | None = None) -> str | None:
    endpoints = section("endpoints", facts or load())
    if path in endpoints:
        return path
    wanted = normalize_path(path)
    for key in endpoints:
        pattern = "^" + re.escape(normalize_path(key)).replace(r"\{\}", "[^/]+") + "$"
        if normalize_path(key) == wanted or re.match(pattern, wanted):
            return key
    return None


def endpoint(path: str, facts: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    facts = facts or load()
    key = endpoint_key(path, facts)
    if key is None:
        return _raise(_unknown("vLLM endpoint", path, list(section("endpoints", facts)), facts))
    return key, section("endpoints", facts)[key]


def env_var(name: str, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    facts = facts or load()
    entry = section("env_vars", facts).get(name)
    if entry is None:
        return _raise(_unknown("vLLM environment variable", name, list(section("env_vars", facts)), facts))
    return entry


def request_field(name: str, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    facts = facts or load()
    entry = section("request_fields", facts).get(name)
    if entry is None:
        return _raise(_unknown("vLLM request field", name, list(section("request_fields", facts)), facts))
    return entry


def named(kind: str, name: str, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """A speculative method, quantization method or structured-output backend by name."""
    facts = facts or load()
    sec = {
        "speculative_method": "speculative_methods",
        "quantization_method": "quantization_methods",
        "structured_output_backend": "structured_output_backends",
    }[kind]
    entry = section(sec, facts).get(name)
    if entry is None:
        return _raise(_unknown(kind.replace("_", " "), name, list(section(sec, facts)), facts))
    return entry


def removed_entry(name: str, facts: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The removed-name entry for a name as written (`--swap-space`) or its Python name (`swap_space`)."""
    entries = section("removed", facts or load())
    if name in entries:
        return entries[name]
    for entry in entries.values():
        if entry.get("python_name") == name:
            return entry
    return None


def removed(name: str, facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """A name vLLM dropped; pages may name it only through the removed() macro."""
    facts = facts or load()
    entry = removed_entry(name, facts)
    if entry is None:
        raise FactError(
            f"removed({name!r}): not in the 'removed' section of labs/data/vllm.yaml. Add it with the "
            "version that dropped it and a source (a release note or the PR), after checking that "
            f"vLLM {version(facts)} no longer has it."
        )
    return entry


def _raise(error: Exception):
    raise error
