"""Every entry of labs/data/vllm.yaml, checked against the installed vLLM.

The site states vLLM facts only through that file, so the file is the one thing
to keep true. Each check asks vLLM itself rather than its source text where it
can: flags and defaults from the `vllm serve` parser (built the way the CLI
builds it) and the EngineArgs / config dataclasses, metric names and types from
a Prometheus registry filled by vLLM's own stat logger, endpoints from the
FastAPI app `vllm serve` builds (no server is started; requests go through a
test client, which also shows which paths the API key guards), and method and
backend names from vLLM's Literal registries.

Every check is a function returning a list of mismatches, each naming the entry
and both values; the tests assert the list is empty. tests/test_content_lint.py
reuses them to show that a planted wrong default is caught.

Nothing is installed here. Without vLLM the tests skip (fail under CI=true,
where .ci/run installs the `vllm` extra). On a machine without a GPU vLLM is
imported with VLLM_TARGET_DEVICE=cpu, which selects its CPU platform: the
parser and the dataclass defaults do not depend on it, and the GPU-dependent
batch defaults are checked with a stand-in platform that reports each GPU's
memory and name.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import importlib.util
import inspect
import math
import os
import typing
from types import SimpleNamespace
from unittest import mock

import pytest
from conftest import HAS_CUDA, ROOT, require_or_skip

from labs import specs, vllm_facts

FACTS = vllm_facts.load()

MISSING = object()


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def same(expected, actual) -> bool:
    """Equality that tolerates the spellings a YAML file can hold for vLLM's values."""
    if isinstance(actual, enum.Enum):
        return expected in (actual, actual.value, actual.name, str(actual.value))
    if dataclasses.is_dataclass(actual) and isinstance(expected, dict):  # a config object: the fields the file names
        return all(hasattr(actual, k) and same(v, getattr(actual, k)) for k, v in expected.items())
    if isinstance(actual, float) and isinstance(expected, (int, float)) and not isinstance(expected, bool):
        return (math.isinf(actual) and math.isinf(expected)) or math.isclose(actual, expected)
    if isinstance(actual, (set, tuple)):
        actual = sorted(actual) if isinstance(actual, set) else list(actual)
        expected = sorted(expected) if isinstance(expected, (set, list)) and isinstance(actual, list) else expected
    if dataclasses.is_dataclass(actual) and not isinstance(actual, type):  # a config object: "ProfilerConfig()"
        return expected == f"{type(actual).__name__}()" and actual == type(actual)()
    if type(expected) is bool or type(actual) is bool:
        return type(expected) is type(actual) and expected == actual
    return expected == actual


def field_default(cls, name: str):
    """The default of a dataclass field (a factory is called), or MISSING."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                default = f.default
                # pydantic dataclasses keep Field(...) objects as the raw default
                if type(default).__name__ == "FieldInfo":
                    return default.get_default(call_default_factory=True)
                return default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            return MISSING
    return MISSING


def actions_by_flag(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every spelling the parser accepts, hidden backwards-compatible ones included."""
    return dict(parser._option_string_actions)


def spellings(parser: argparse.ArgumentParser, action: argparse.Action) -> tuple[list[str], list[str]]:
    """(shown in --help, accepted but hidden) option strings of one argument."""
    accepted = {opt for opt, a in parser._option_string_actions.items() if a is action}
    return sorted(action.option_strings), sorted(accepted - set(action.option_strings))


def resolve_dotted(path: str):
    """'vllm.config.cache.CacheConfig.DEFAULT_BLOCK_SIZE' -> its value in the installed vLLM."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


class StandInPlatform:
    """The part of vLLM's platform that EngineArgs.get_batch_defaults asks, for one GPU."""

    def __init__(self, memory_bytes: int, name: str, capability: tuple[int, int] = (9, 0)):
        self.memory_bytes, self.name, self.capability = memory_bytes, name, capability

    def get_device_total_memory(self, device_id: int = 0) -> int:
        return self.memory_bytes

    def get_device_name(self, device_id: int = 0) -> str:
        return self.name

    def is_device_capability(self, capability, device_id: int = 0) -> bool:
        return tuple(capability) == self.capability

    def is_tpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False


def vllm_batch_defaults(memory_bytes: int, name: str, capability=(9, 0)) -> dict[str, dict[str, int]]:
    """What vLLM's get_batch_defaults returns on a GPU of this memory and name, by usage context."""
    from vllm.engine import arg_utils

    with mock.patch.object(arg_utils, "current_platform", StandInPlatform(memory_bytes, name, capability)):
        tokens, seqs = arg_utils.EngineArgs.get_batch_defaults(world_size=1)
    return {
        ctx.name: {"max_num_batched_tokens": tokens[ctx], "max_num_seqs": seqs[ctx]} for ctx in tokens
    }


# ---------------------------------------------------------------------------
# Fixtures: vLLM imported once, the parser and the registry built once
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm():
    require_or_skip(importlib.util.find_spec("vllm") is not None, "vllm", "pip install -e '.[vllm]'")
    if not HAS_CUDA:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    return importlib.import_module("vllm")


@pytest.fixture(scope="module")
def serve_parser(vllm):
    """The parser `vllm serve` uses: FlexibleArgumentParser + make_arg_parser."""
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


@pytest.fixture(scope="module")
def registered_metrics(vllm):
    """name -> collector, from a Prometheus registry filled by vLLM's PrometheusStatLogger.

    The logger is given a stand-in config with every optional feature on
    (speculation, LoRA, KV-cache metrics, MFU metrics, NaN checks), so metrics that
    exist only with a setting register too.
    """
    import prometheus_client

    os.environ["VLLM_COMPUTE_NANS_IN_LOGITS"] = "1"
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    cfg = mock.MagicMock()
    cfg.model_config.served_model_name = "facts-check"
    cfg.model_config.max_model_len = 4096
    cfg.model_config.is_diffusion = False
    cfg.speculative_config.num_speculative_tokens = 3
    cfg.observability_config.show_hidden_metrics = False
    cfg.observability_config.kv_cache_metrics = True
    cfg.observability_config.kv_cache_metrics_sample = 0.01
    cfg.observability_config.custom_histogram_buckets = None
    cfg.observability_config.enable_mfu_metrics = True
    cfg.lora_config.max_loras = 2
    cfg.kv_transfer_config = None
    cfg.ec_transfer_config = None
    registry = prometheus_client.REGISTRY
    before = set(registry._collector_to_names)
    logger = PrometheusStatLogger(cfg, engine_indexes=[0])
    logger.log_metrics_info("cache_config", SimpleNamespace(metrics_info=lambda: {"block_size": "16"}))
    added = [c for c in registry._collector_to_names if c not in before]
    found = {c._name: c for c in added if getattr(c, "_name", "").startswith("vllm:")}
    yield found
    for collector in added:
        registry.unregister(collector)
    os.environ.pop("VLLM_COMPUTE_NANS_IN_LOGITS", None)


# ---------------------------------------------------------------------------
# Checks: each returns the mismatches as messages naming the entry and both values
# ---------------------------------------------------------------------------


def _resolver_batch(name: str, entry: dict) -> object:
    target = entry.get("resolved_for")
    if not target or "gpu" not in target:
        raise ValueError("the value depends on the GPU and the entry point: add "
                         "resolved_for: {gpu: <a GPU of labs/data/gpus.yaml>, entry: vllm serve | LLM}")
    gpu = specs.get_gpu(target["gpu"])
    context = vllm_facts.USAGE_CONTEXTS[target.get("entry", "vllm serve")]
    return vllm_batch_defaults(gpu.memory_bytes_reported, gpu.display_name)[context][name]


def _resolver_decoder_model(name: str, entry: dict) -> object:
    """Run EngineArgs' own defaulting for a decoder-only generative model (Llama-style)."""
    from vllm.config import ModelConfig
    from vllm.engine.arg_utils import EngineArgs

    shape = SimpleNamespace(attn_type="decoder", pooler_config=None)
    model = SimpleNamespace(
        runner_type="generate",
        is_chunked_prefill_supported=ModelConfig.is_chunked_prefill_supported.fget(shape),
        is_prefix_caching_supported=ModelConfig.is_prefix_caching_supported.fget(shape),
    )
    args = EngineArgs()
    args._set_default_chunked_prefill_and_prefix_caching_args(model)
    return getattr(args, name)


def _resolver_block_size(name: str, entry: dict) -> object:
    from vllm.config import CacheConfig

    return CacheConfig(block_size=None).block_size


def _resolver_async_scheduling(name: str, entry: dict) -> object:
    """The unset case ends in `async_scheduling = True` when nothing is incompatible."""
    from vllm.config.vllm import VllmConfig

    source = inspect.getsource(VllmConfig)
    block = source[source.index("async_scheduling is None"):]
    block = block[: block.index("disable_nccl_for_dp_synchronization")]
    return "self.scheduler_config.async_scheduling = True" in block


def _resolver_cudagraph_size(name: str, entry: dict) -> object:
    """min(max_num_seqs x decode_query_len x 2, 512) on non-Blackwell GPUs, without speculation."""
    from vllm.config.vllm import VllmConfig

    source = inspect.getsource(VllmConfig._set_cudagraph_sizes)
    assert "1024 if current_platform.is_device_capability_family(100) else 512" in source
    assert "max_num_seqs * decode_query_len * 2" in source
    seqs = _resolver_batch("max_num_seqs", {"resolved_for": entry.get("resolved_for") or {"gpu": "h200"}})
    return min(seqs * 1 * 2, 512)


def llm_class_default(name: str) -> object:
    """What the offline LLM class passes for an argument it is not given: its own default, or a kwargs override."""
    import ast

    from vllm.entrypoints.llm import LLM

    param = inspect.signature(LLM.__init__).parameters.get(name)
    if param is not None and param.default is not inspect.Parameter.empty:
        return param.default
    for node in ast.walk(ast.parse(inspect.getsource(LLM.__init__).lstrip())):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript):
            target = node.targets[0]
            if ast.unparse(target.value) == "kwargs" and ast.unparse(target.slice) == repr(name):
                return ast.literal_eval(node.value)
    return MISSING


# How to compute, in the installed vLLM, each `resolved` value the file states.
RESOLVERS = {
    "block_size": _resolver_block_size,
    "enable_prefix_caching": _resolver_decoder_model,
    "enable_chunked_prefill": _resolver_decoder_model,
    "max_num_seqs": _resolver_batch,
    "max_num_batched_tokens": _resolver_batch,
    "async_scheduling": _resolver_async_scheduling,
    "max_cudagraph_capture_size": _resolver_cudagraph_size,
}


def check_args(facts: dict, parser: argparse.ArgumentParser, section: str) -> list[str]:
    """Flags, aliases, defaults, config fields, choices and resolved values of engine or server args."""
    from vllm import config as vllm_config
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import FrontendArgs

    dataclass = AsyncEngineArgs if section == "engine_args" else FrontendArgs
    actions = actions_by_flag(parser)
    problems = []
    for name, entry in (facts.get(section) or {}).items():
        where = f"{section}.{name}"
        action = actions.get(entry["flag"])
        if action is None:
            problems.append(f"{where}: flag {entry['flag']} is not an option of `vllm serve`")
            continue
        if action.dest != name:
            problems.append(f"{where}: {entry['flag']} sets {action.dest!r} in vLLM, the file's key is {name!r}")
        shown, hidden = spellings(parser, action)
        aliases = sorted(set(shown) - {entry["flag"]})
        if entry["flag"] not in shown:
            problems.append(f"{where}: {entry['flag']} is accepted but hidden from --help; its shown spellings "
                            f"are {shown}")
        if sorted(entry.get("aliases", [])) != aliases:
            problems.append(f"{where}: aliases: file has {sorted(entry.get('aliases', []))}, vLLM has {aliases}")
        for abbreviation in entry.get("abbreviations", []):
            # argparse's rule: an abbreviation works when it is a prefix of exactly one argument's spellings
            owners = {id(a) for opt, a in parser._option_string_actions.items() if opt.startswith(abbreviation)}
            if not parser.allow_abbrev or owners != {id(action)}:
                problems.append(f"{where}: abbreviation {abbreviation} does not select {entry['flag']} alone")
        if sorted(entry.get("hidden_aliases", [])) != hidden:
            problems.append(f"{where}: hidden_aliases: file has {sorted(entry.get('hidden_aliases', []))}, "
                            f"vLLM accepts {hidden} without showing them in --help")
        raw = field_default(dataclass, name)
        if raw is not MISSING and not same(entry["default"], raw):
            problems.append(f"{where}: default: file has {entry['default']!r}, {dataclass.__name__}.{name} is {raw!r}")
        if raw is MISSING and section == "engine_args":
            problems.append(f"{where}: {dataclass.__name__} has no field {name!r}")
        cli = entry.get("cli_default", entry["default"])
        if not same(cli, action.default):
            problems.append(f"{where}: `vllm serve` default: file has {cli!r}, the parser stores {action.default!r}")
        if "config" in entry:
            cls_name, field_name = entry["config"].split(".")
            cls = getattr(vllm_config, cls_name, None)
            value = MISSING if cls is None else field_default(cls, field_name)
            expected = entry.get("config_default", entry["default"])
            if value is MISSING:
                problems.append(f"{where}: config {entry['config']} does not exist in vllm.config")
            elif not same(expected, value):
                problems.append(f"{where}: config {entry['config']} default: file has {expected!r}, vLLM has {value!r}")
        if "choices" in entry:
            actual = sorted(str(c) for c in (action.choices or []) if c is not None)
            if sorted(str(c) for c in entry["choices"]) != actual:
                problems.append(f"{where}: choices: file has {sorted(entry['choices'])}, vLLM has {actual}")
        if "llm_default" in entry:
            value = llm_class_default(name)
            if not same(entry["llm_default"], value):
                problems.append(f"{where}: llm_default: file has {entry['llm_default']!r}, LLM() uses {value!r}")
        if "resolved" in entry:
            resolver = RESOLVERS.get(name)
            if resolver is None:
                problems.append(f"{where}: resolved {entry['resolved']!r} has no check; add one to RESOLVERS "
                                "in tests/test_vllm_facts.py")
            else:
                try:
                    value = resolver(name, entry)
                except Exception as err:  # a resolver that cannot run is a mismatch to report, not a crash
                    problems.append(f"{where}: resolved {entry['resolved']!r} could not be checked: {err}")
                    continue
                if not same(entry["resolved"], value):
                    problems.append(f"{where}: resolved: file has {entry['resolved']!r}, vLLM gives {value!r}")
    return problems


def check_batch_defaults(facts: dict) -> list[str]:
    """The tier table against get_batch_defaults, at each floor, just under it, and for excluded names."""
    from vllm.config import SchedulerConfig
    from vllm.usage.usage_lib import UsageContext

    table = facts["batch_defaults"]
    problems = []
    fallback = {
        "max_num_batched_tokens": SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS,
        "max_num_seqs": SchedulerConfig.DEFAULT_MAX_NUM_SEQS,
    }
    if table["fallback"] != fallback:
        problems.append(f"batch_defaults.fallback: file has {table['fallback']}, SchedulerConfig has {fallback}")
    probes = []
    for tier in table["tiers"]:
        floor = int(tier["min_memory_gib"] * vllm_facts.GIB)
        probes.append((floor, "NVIDIA Probe GPU", (9, 0)))
        if floor:
            probes.append((floor - 2**20, "NVIDIA Probe GPU", (9, 0)))
        for word in tier.get("exclude_device_names", []):
            probes.append((floor, f"NVIDIA {word.upper()}-SXM4-80GB", (8, 0)))
        for cap in tier.get("exclude_capabilities", []):
            probes.append((floor, "NVIDIA Probe GPU", tuple(int(p) for p in cap.split("."))))
    for memory, name, cap in probes:
        actual = vllm_batch_defaults(memory, name, cap)
        for context in ("OPENAI_API_SERVER", "LLM_CLASS"):
            for arg in ("max_num_batched_tokens", "max_num_seqs"):
                expected = vllm_facts.batch_default(arg, memory, name, context, ".".join(map(str, cap)), facts)
                if expected != actual[context][arg]:
                    problems.append(
                        f"batch_defaults: {arg} for {context} on {name} with {memory / 2**30:.2f} GiB "
                        f"(capability {cap}): file gives {expected}, vLLM gives {actual[context][arg]}"
                    )
    for context in ("OPENAI_API_SERVER", "LLM_CLASS"):
        if context not in UsageContext.__members__:
            problems.append(f"batch_defaults: {context} is not a vllm.usage.usage_lib.UsageContext")
    return problems


def check_bench_args(facts: dict) -> list[str]:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    problems = []
    for command, bench in (facts.get("bench_args") or {}).items():
        parser = FlexibleArgumentParser()
        builder = importlib.import_module(bench["module"])
        for attr in bench.get("builder", "add_cli_args").split("."):
            builder = getattr(builder, attr)
        builder(parser)
        actions = actions_by_flag(parser)
        has_engine = "--gpu-memory-utilization" in actions
        if has_engine != bench["engine_flags"]:
            problems.append(f"bench_args.{command}: engine_flags is {bench['engine_flags']}, vLLM: {has_engine}")
        for flag, entry in bench["flags"].items():
            action = actions.get(flag)
            if action is None:
                problems.append(f"bench_args.{command}: {flag} is not an option of `vllm bench {command}`")
            elif not same(entry["default"], action.default):
                problems.append(f"bench_args.{command}.{flag}: default: file has {entry['default']!r}, "
                                f"vLLM has {action.default!r}")
    return problems


def check_metrics(facts: dict, registered: dict) -> list[str]:
    problems = []
    for name, entry in (facts.get("metrics") or {}).items():
        collector = registered.get(name)
        if collector is None:
            problems.append(f"metrics.{name}: vLLM's stat logger registers no such metric")
            continue
        if collector._type != entry["type"]:
            problems.append(f"metrics.{name}: type: file has {entry['type']}, vLLM has {collector._type}")
        labels = list(collector._labelnames)
        if entry.get("labels") is not None and entry["labels"] != labels:
            problems.append(f"metrics.{name}: labels: file has {entry['labels']}, vLLM has {labels}")
    return problems


def _app_routes(app) -> set[tuple[str, str]]:
    routes = set()
    for route in app.routes:
        methods = getattr(route, "methods", None) or {"GET"}
        for method in methods:
            routes.add((route.path, method))
    return routes


def build_app(parser, argv: list[str], tasks: tuple[str, ...] = ("generate",), env: dict | None = None):
    """The FastAPI app `vllm serve` would serve, built without an engine or a socket."""
    from vllm.entrypoints.launchers.app import build_app as vllm_build_app

    model_config = mock.MagicMock()
    model_config.get_pooling_task.side_effect = lambda supported: next(
        (t for t in supported if t in ("embed", "classify", "score", "token_embed")), None)
    cleared = {"VLLM_SERVER_DEV_MODE": None, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": None, "VLLM_API_KEY": None}
    with mock.patch.dict(os.environ, {}, clear=False):
        for key in cleared:
            os.environ.pop(key, None)
        os.environ.update(env or {})
        args = parser.parse_args(argv)
        return vllm_build_app(args, supported_tasks=tasks, model_config=model_config)


def _requirement_app(parser, requires: dict, api_key: bool = False):
    argv = ["--api-key", "facts-check"] if api_key else []
    if "task" in requires:
        return build_app(parser, argv, ("generate", requires["task"]))
    if "env" in requires:
        return build_app(parser, argv, env={requires["env"]: "1"})
    if "flag" in requires:
        value = {"--profiler-config": '{"profiler": "torch", "torch_profiler_dir": "/tmp/vllm-facts-profile"}'}
        return build_app(parser, argv + [requires["flag"], value[requires["flag"]]])
    raise ValueError(f"unknown requirement {requires}")


def check_endpoints(facts: dict, parser) -> list[str]:
    """Routes exist with their methods, only under their requirement, and the API key guards exactly `api_key: true`."""
    from starlette.testclient import TestClient

    problems = []
    baseline = _app_routes(build_app(parser, []))
    guarded_app = build_app(parser, ["--api-key", "facts-check"])
    for path, entry in (facts.get("endpoints") or {}).items():
        requires = entry.get("requires")
        app = guarded_app if not requires else _requirement_app(parser, requires, api_key=True)
        routes = _app_routes(app)
        for method in entry["methods"]:
            if (path, method) not in routes:
                problems.append(f"endpoints.{path}: vLLM registers no {method} {path}"
                                + (f" with {requires}" if requires else " for a generative model"))
            if requires and (path, method) in baseline:
                problems.append(f"endpoints.{path}: file says it needs {requires}, but vLLM registers it without")
        concrete = path.replace("{response_id}", "resp_facts_check")
        status = TestClient(app, raise_server_exceptions=False).request(entry["methods"][0], concrete, json={}).status_code
        guarded = status == 401
        if guarded != entry["api_key"]:
            problems.append(f"endpoints.{path}: api_key: file has {entry['api_key']}, a request without the key "
                            f"got HTTP {status} (401 means guarded)")
    return problems


def check_api_key_prefixes(facts: dict) -> list[str]:
    from vllm.entrypoints.serve.middleware.authenticate import GUARDED_PREFIX

    mine = (facts.get("api_key_prefixes") or {}).get("prefixes", [])
    if sorted(mine) != sorted(GUARDED_PREFIX):
        return [f"api_key_prefixes: file has {sorted(mine)}, GUARDED_PREFIX is {sorted(GUARDED_PREFIX)}"]
    return []


def check_env_vars(facts: dict) -> list[str]:
    from vllm import envs

    problems = []
    for name, entry in (facts.get("env_vars") or {}).items():
        getter = envs.environment_variables.get(name)
        if getter is None:
            problems.append(f"env_vars.{name}: not in vllm/envs.py environment_variables")
            continue
        if "default" in entry:
            with mock.patch.dict(os.environ, {}, clear=False):
                os.environ.pop(name, None)
                value = getter()
            if not same(entry["default"], value):
                problems.append(f"env_vars.{name}: default: file has {entry['default']!r}, vLLM gives {value!r}")
    return problems


def _request_field_default(cls, name: str):
    if hasattr(cls, "model_fields"):
        field = cls.model_fields.get(name)
        if field is None:
            return MISSING
        if field.is_required():
            return "required"
        return field.get_default(call_default_factory=True)
    fields = cls.__struct_fields__
    if name not in fields:
        return MISSING
    defaults = dict(zip(fields[len(fields) - len(cls.__struct_defaults__):], cls.__struct_defaults__))
    return defaults.get(name, "required")


def check_request_fields(facts: dict) -> list[str]:
    classes = {
        name: getattr(importlib.import_module(spec["module"]), name)
        for name, spec in (facts.get("request_classes") or {}).items()
    }
    problems = []
    for field, entry in (facts.get("request_fields") or {}).items():
        for cls_name, expected in entry["defaults"].items():
            cls = classes.get(cls_name)
            if cls is None:
                problems.append(f"request_fields.{field}: class {cls_name} is not in request_classes")
                continue
            value = _request_field_default(cls, field)
            if value is MISSING:
                problems.append(f"request_fields.{field}: {cls_name} has no field {field!r}")
            elif not same(expected, value):
                problems.append(f"request_fields.{field}: {cls_name} default: file has {expected!r}, vLLM has {value!r}")
    return problems


def registry_names() -> dict[str, set[str]]:
    from vllm.config.speculative import SpeculativeMethod
    from vllm.config.structured_outputs import StructuredOutputsBackend
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    return {
        "speculative_methods": set(typing.get_args(SpeculativeMethod)),
        "quantization_methods": set(QUANTIZATION_METHODS),
        "structured_output_backends": set(typing.get_args(StructuredOutputsBackend)),
    }


def check_registries(facts: dict) -> list[str]:
    problems = []
    for section, known in registry_names().items():
        for name in facts.get(section) or {}:
            if name not in known:
                problems.append(f"{section}.{name}: not in vLLM's list {sorted(known)}")
    return problems


def check_kernel_constants(facts: dict) -> list[str]:
    """Each constant against the assignment in its module's source. Read, not imported: a backend
    module pulls in its GPU kernels, and the value is what the file says on any machine."""
    from labs.source_constants import assigned_literals

    problems = []
    for name, entry in (facts.get("kernel_constants") or {}).items():
        spec = importlib.util.find_spec(entry["module"])
        if spec is None or spec.origin is None:
            problems.append(f"kernel_constants.{name}: no module {entry['module']}")
            continue
        values = assigned_literals(spec.origin, name)
        if values != [entry["value"]]:
            problems.append(f"kernel_constants.{name}: file has {entry['value']!r}, {entry['module']} assigns {values}")
    return problems


def check_removed(facts: dict, parser, registered: dict) -> list[str]:
    """A removed name must really be gone from the installed vLLM."""
    from vllm import envs
    from vllm.engine.arg_utils import AsyncEngineArgs

    flags = actions_by_flag(parser)
    arg_fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    request_fields = set()
    for spec_name, spec in (facts.get("request_classes") or {}).items():
        cls = getattr(importlib.import_module(spec["module"]), spec_name)
        request_fields |= set(getattr(cls, "model_fields", None) or cls.__struct_fields__)
    present = {
        "flag": lambda n, e: n in flags or e.get("python_name") in arg_fields,
        "env_var": lambda n, e: n in envs.environment_variables,
        "request_field": lambda n, e: n in request_fields,
        "metric": lambda n, e: n in registered,
        "quantization_method": lambda n, e: n in registry_names()["quantization_methods"],
        "speculative_method": lambda n, e: n in registry_names()["speculative_methods"],
    }
    problems = []
    for name, entry in (facts.get("removed") or {}).items():
        check = present.get(entry["kind"])
        if check is None:
            problems.append(f"removed.{name}: unknown kind {entry['kind']!r} (one of {sorted(present)})")
        elif check(name, entry):
            problems.append(f"removed.{name}: listed as removed, but vLLM {facts['version']} still has it")
    return problems


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


def _assert_none(problems: list[str]) -> None:
    assert not problems, f"{len(problems)} mismatch(es) between labs/data/vllm.yaml and the installed vLLM:\n  " + \
        "\n  ".join(problems)


def test_installed_version_is_the_files(vllm):
    assert vllm.__version__.split("+")[0] == FACTS["version"], (
        f"labs/data/vllm.yaml describes vLLM {FACTS['version']}, installed is {vllm.__version__}"
    )


def test_engine_args(serve_parser):
    _assert_none(check_args(FACTS, serve_parser, "engine_args"))


def test_server_args(serve_parser):
    _assert_none(check_args(FACTS, serve_parser, "server_args"))


def test_batch_defaults(vllm):
    _assert_none(check_batch_defaults(FACTS))


def test_batch_defaults_for_every_gpu_in_the_data(vllm):
    """The table the site renders from agrees with vLLM on each GPU the site names."""
    problems = []
    for name, gpu in specs.all_gpus().items():
        actual = vllm_batch_defaults(gpu.memory_bytes_reported, gpu.display_name)
        for context in ("OPENAI_API_SERVER", "LLM_CLASS"):
            for arg in ("max_num_batched_tokens", "max_num_seqs"):
                mine = vllm_facts.batch_default(arg, gpu.memory_bytes_reported, gpu.display_name, context)
                if mine != actual[context][arg]:
                    problems.append(f"{name}: {arg} ({context}): facts give {mine}, vLLM {actual[context][arg]}")
    _assert_none(problems)


def test_bench_args(vllm):
    _assert_none(check_bench_args(FACTS))


def test_metrics(registered_metrics):
    _assert_none(check_metrics(FACTS, registered_metrics))


def test_endpoints(serve_parser):
    _assert_none(check_endpoints(FACTS, serve_parser))


def test_api_key_prefixes(vllm):
    _assert_none(check_api_key_prefixes(FACTS))


def test_env_vars(vllm):
    _assert_none(check_env_vars(FACTS))


def test_request_fields(vllm):
    _assert_none(check_request_fields(FACTS))


def test_method_and_backend_names(vllm):
    _assert_none(check_registries(FACTS))


def test_kernel_constants(vllm):
    _assert_none(check_kernel_constants(FACTS))


def test_removed_names_are_gone(serve_parser, registered_metrics):
    _assert_none(check_removed(FACTS, serve_parser, registered_metrics))


def test_the_facts_file_is_the_one_the_site_reads():
    assert vllm_facts.FACTS_FILE == ROOT / "labs" / "data" / "vllm.yaml"


def test_a_planted_wrong_default_or_flag_in_a_copy_of_the_facts_file_is_caught(serve_parser, tmp_path):
    """A copy of the file with 0.9 for gpu_memory_utilization (the pre-0.33 value) and V0's --swap-space."""
    text = vllm_facts.FACTS_FILE.read_text(encoding="utf-8")
    text = text.replace("  gpu_memory_utilization:\n    flag: --gpu-memory-utilization\n",
                        "  swap_space:\n    flag: --swap-space\n    default: 4\n"
                        "    meaning: V0's CPU swap space.\n    source: vllm/config/cache.py\n"
                        "  gpu_memory_utilization:\n    flag: --gpu-memory-utilization\n", 1)
    planted = tmp_path / "vllm.yaml"
    planted.write_text(text, encoding="utf-8")
    facts = vllm_facts.load(planted)
    facts["engine_args"]["gpu_memory_utilization"]["default"] = 0.9
    problems = check_args(facts, serve_parser, "engine_args")
    assert any(p.startswith("engine_args.gpu_memory_utilization: default: file has 0.9,") and p.endswith("is 0.92")
               for p in problems), problems
    assert "engine_args.swap_space: flag --swap-space is not an option of `vllm serve`" in problems, problems


def test_every_caller_reads_a_gpu_as_vllm_does_through_nvml():
    """The KV budget, the simulator's defaults and the pages pick the tier from one function, which
    reads NVML's total (nvidia-smi's figure), not cudaMemGetInfo's smaller one: a GPU between the
    two figures at the 160 GiB floor shows which is read."""
    from labs.kv_sizing import memory_budget
    from labs.serving_sim import defaults

    for gpu in specs.all_gpus().values():
        picked = (vllm_facts.gpu_batch_default("max_num_batched_tokens", gpu),
                  vllm_facts.gpu_batch_default("max_num_seqs", gpu))
        sim = defaults.batch_defaults(gpu)
        assert memory_budget.vllm_batch_defaults(gpu) == picked == (sim.max_num_batched_tokens, sim.max_num_seqs)
    edge = dataclasses.replace(specs.get_gpu("h200"), memory_gb_marketed=180, memory_mib_reported=164_000,
                               memory_mib_cuda=163_000)  # 160.2 GiB by NVML, 159.2 by cudaMemGetInfo
    assert vllm_facts.gpu_batch_default("max_num_batched_tokens", edge) == 16384
