"""The front end: `LLM(model, ...).generate(prompts, SamplingParams(...))`, as vLLM's offline API.

It builds the pieces (model, block manager, scheduler with the wall clock, runner) and runs
the loop every engine runs: schedule, execute, update. A bad request (empty, too long, a
bad sampling value, another model's name) gets an error in its own output and never enters
the scheduler; the rest of the batch runs as if it had not been there.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from labs.engine.block_manager import BlockManager
from labs.engine.config import ConfigError, EngineConfig, ModelConfig
from labs.engine.model import LlamaModel, rope_inv_freq
from labs.engine.runner import ModelRunner
from labs.engine.scheduler import Scheduler
from labs.engine.sequence import RequestError, SamplingParams, Sequence
from labs.engine.tokenizer import ByteTokenizer, HFTokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "length", "stop", "abort"
    error: str | None = None  # why the request was refused; then nothing else is set
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache
    ttft_s: float | None = None
    e2e_s: float | None = None


@dataclass
class StepRecord:
    seconds: float
    num_tokens: int
    num_seqs: int
    decode_only: bool


def load_safetensors(folder: Path, device: torch.device) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"--weights {folder}: no *.safetensors files in it")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f), device=str(device)))
    return sd


class LLM:
    def __init__(self, model: str = "llama-3.1-8b", *, weights: str | Path | None = None,
                 model_config: ModelConfig | None = None, n_layers: int | None = None, dtype: str = "auto",
                 device: str | None = None, seed: int = 0, decode_attention: str = "triton",
                 cuda_graphs: bool | str = True, mixed_attention: str = "auto", **engine_args):
        """model: a name from labs/data/models.yaml (seeded random weights), ignored when `weights`
        names a local Hugging Face folder or `model_config` is given. n_layers: keep only the first
        N layers (a smaller model of the same shapes). decode_attention, cuda_graphs,
        mixed_attention: ModelRunner's. engine_args: EngineConfig's fields.
        """
        if model_config is None:
            model_config = ModelConfig.from_hf_folder(weights) if weights else ModelConfig.from_spec(model)
        if n_layers is not None:
            if not isinstance(n_layers, int) or not 1 <= n_layers <= model_config.n_layers:
                raise ConfigError(f"n_layers must be in [1, {model_config.n_layers}], got {n_layers!r}")
            model_config = model_config.replace(n_layers=n_layers)
        self.model_name = model_config.name
        self.config = EngineConfig(**engine_args)
        if self.config.max_model_len > model_config.max_position_embeddings:
            raise ConfigError(f"max_model_len {self.config.max_model_len} exceeds the model's "
                              f"max_position_embeddings {model_config.max_position_embeddings}")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dtype == "auto":
            dtype = "bfloat16" if self.device.type == "cuda" else "float32"
        if dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of auto, {', '.join(DTYPES)}, got {dtype!r}")
        self.model = self._build(model_config, DTYPES[dtype], weights, seed)
        if weights and (Path(weights) / "tokenizer.json").is_file():
            self.tokenizer = HFTokenizer(weights, model_config.eos_token_ids)
        else:
            self.tokenizer = ByteTokenizer(model_config.vocab_size)
        c = self.config
        self.blocks = BlockManager(c.usable_blocks + 1, c.block_size, c.enable_prefix_caching)
        self.scheduler = Scheduler(c, self.blocks, time.perf_counter, eos_token_ids=self.tokenizer.eos_token_ids)
        self.runner = ModelRunner(self.model, c, decode_attention=decode_attention, cuda_graphs=cuda_graphs,
                                  mixed_attention=mixed_attention)
        self._decode_attention, self._cuda_graphs, self._mixed = decode_attention, cuda_graphs, mixed_attention
        self.steps: list[StepRecord] = []
        self._next_id = 0

    def reconfigure(self, **engine_args) -> None:
        """New engine limits (EngineConfig's fields) on the same weights: a fresh pool, scheduler and runner.

        A benchmark sweeps max_num_seqs, pools and token budgets without reloading 16 GB of weights.
        """
        self.runner = self.scheduler = self.blocks = None  # free the old pool and graphs first
        gc.collect()  # a captured graph's closure refers back to its runner: a cycle
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.config = c = EngineConfig(**engine_args)
        if c.max_model_len > self.model.cfg.max_position_embeddings:
            raise ConfigError(f"max_model_len {c.max_model_len} exceeds the model's "
                              f"max_position_embeddings {self.model.cfg.max_position_embeddings}")
        self.blocks = BlockManager(c.usable_blocks + 1, c.block_size, c.enable_prefix_caching)
        self.scheduler = Scheduler(c, self.blocks, time.perf_counter, eos_token_ids=self.tokenizer.eos_token_ids)
        self.runner = ModelRunner(self.model, c, decode_attention=self._decode_attention, cuda_graphs=self._cuda_graphs,
                                  mixed_attention=self._mixed)
        self.steps = []

    def _build(self, cfg: ModelConfig, dtype: torch.dtype, weights, seed: int) -> LlamaModel:
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device("meta"):  # no memory until the weights' real home is known
                model = LlamaModel(cfg)
        finally:
            torch.set_default_dtype(default)
        model = model.to_empty(device=self.device)
        model.inv_freq = rope_inv_freq(cfg).to(self.device)  # stays fp32
        if weights:
            try:
                model.load_hf_state_dict(load_safetensors(Path(weights), self.device))
            except KeyError as exc:
                raise ConfigError(f"--weights {weights}: {exc.args[0]}") from None
        else:
            model.init_random(seed)
        return model.eval()

    # --- requests ---------------------------------------------------------------------

    def _request(self, prompt, params) -> tuple[Sequence | None, RequestOutput]:
        rid = self._next_id
        self._next_id += 1
        text, ids = None, None
        try:
            if isinstance(prompt, dict):
                unknown = sorted(set(prompt) - {"prompt", "prompt_token_ids", "model"})
                if unknown:
                    raise RequestError(f"unknown request field {unknown[0]!r}; allowed: model, prompt, prompt_token_ids")
                if prompt.get("model", self.model_name) != self.model_name:
                    raise RequestError(f"model {prompt['model']!r} is not served here; this engine serves "
                                       f"{self.model_name!r}")
                if "prompt_token_ids" in prompt:
                    ids = prompt["prompt_token_ids"]
                else:
                    prompt = prompt.get("prompt")
            if ids is None:
                if isinstance(prompt, str):
                    text, ids = prompt, self.tokenizer.encode(prompt)
                elif isinstance(prompt, (list, tuple)):
                    ids = prompt
                else:
                    raise RequestError(f"a prompt must be a string, a list of token ids or a dict, got "
                                       f"{type(prompt).__name__}")
            ids = list(ids)
            vocab = self.model.cfg.vocab_size
            if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab for t in ids):
                raise RequestError(f"prompt token ids must be integers in [0, {vocab})")
            if not ids:
                raise RequestError("the prompt is empty")
            if len(ids) >= self.config.max_model_len:
                raise RequestError(f"the prompt has {len(ids)} tokens; with at least 1 output token that is more "
                                   f"than max_model_len {self.config.max_model_len}")
            if isinstance(params, dict):
                params = SamplingParams.from_dict(params)
            elif not isinstance(params, SamplingParams):
                raise RequestError(f"sampling parameters must be SamplingParams or a dict, got {type(params).__name__}")
            longest = min(len(ids) + params.max_tokens, self.config.max_model_len)
            if self.blocks.blocks_for(longest) > self.blocks.num_usable:
                raise RequestError(f"the request can grow to {longest} tokens, more than the whole KV pool "
                                   f"({self.blocks.num_usable} blocks of {self.config.block_size}) holds")
        except (RequestError, TypeError) as exc:
            return None, RequestOutput(rid, text, ids or [], error=str(exc))
        return Sequence(rid, ids, params, arrival=time.perf_counter()), RequestOutput(rid, text, ids)

    def add_request(self, prompt, params: SamplingParams | dict) -> tuple[Sequence | None, RequestOutput]:
        """Queue one request; a bad one comes back with `error` set and is not queued."""
        seq, out = self._request(prompt, params)
        if seq is not None:
            self.scheduler.add(seq)
        return seq, out

    def abort(self, seq: Sequence) -> None:
        self.scheduler.abort(seq)
        self.runner.release(seq.seq_id)

    # --- the loop ---------------------------------------------------------------------

    def step(self) -> list[Sequence]:
        """One engine step: schedule, run on the device, update. Returns the sequences that finished."""
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        if not out.chunks:
            if not out.preempted and not self.scheduler.running:  # admission checks make this unreachable
                raise RuntimeError("the scheduler admitted nothing into an empty engine; this is a bug")
            return []
        tokens = self.runner.execute(out)  # .tolist() inside waits for the device
        finished = self.scheduler.update(out, tokens)
        self.steps.append(StepRecord(time.perf_counter() - t0, out.num_tokens, len(out.chunks), out.is_decode_only))
        for seq in finished:
            self.runner.release(seq.seq_id)
        return finished

    def generate(self, prompts, sampling_params=None,
                 progress: bool | Callable[[int, int, int], None] = False) -> list[RequestOutput]:
        """Outputs in prompt order. sampling_params: one for all, or a list with one per prompt.

        progress: True prints a line to stderr every 2 s; a callable gets (steps, finished, total).
        """
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, list):
            if len(sampling_params) != len(prompts):
                raise RequestError(f"{len(sampling_params)} sampling parameter sets for {len(prompts)} prompts")
            per = sampling_params
        else:
            per = [sampling_params] * len(prompts)
        pairs = [self.add_request(p, sp) for p, sp in zip(prompts, per)]
        live = {seq.seq_id: (seq, out) for seq, out in pairs if seq is not None}
        done, last_print = 0, time.perf_counter()
        while self.scheduler.has_work():
            done += len(self.step())
            if progress is True and time.perf_counter() - last_print > 2:
                last_print = time.perf_counter()
                print(f"step {len(self.steps)}: {done}/{len(live)} requests done, "
                      f"{len(self.scheduler.running)} running, {len(self.scheduler.waiting)} waiting",
                      file=sys.stderr, flush=True)
            elif callable(progress):
                progress(len(self.steps), done, len(live))
        for seq, out in live.values():
            out.token_ids = seq.output_ids
            out.text = self.tokenizer.decode(seq.output_ids)
            out.finish_reason = seq.finish_reason
            out.num_cached_tokens = seq.num_cached_tokens
            if seq.first_token_time is not None:
                out.ttft_s = seq.first_token_time - seq.arrival
                out.e2e_s = seq.finish_time - seq.arrival
        return [out for _, out in pairs]
