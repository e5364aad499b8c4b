"""Shared by the engine's CPU and GPU tests: small configs and the transformers reference.

The reference is Hugging Face transformers' LlamaForCausalLM built from the engine's own
ModelConfig (`hf_config_dict`) and loaded with the engine's weights (`hf_state_dict`), so
any difference is the engine's. It is imported only inside the helpers, so collecting the
tests needs no transformers.
"""

from __future__ import annotations

import torch

from labs.engine.config import ModelConfig
from labs.engine.model import LlamaModel, rope_inv_freq


def small_config(**changes) -> ModelConfig:
    """Llama 3.1's recipe (RoPE theta, llama3 scaling, GQA) at a size a CPU runs in milliseconds."""
    base = dict(name="tiny-llama", n_layers=2, hidden_size=64, n_heads=4, n_kv_heads=2, head_dim=16,
                intermediate_size=128, vocab_size=512, max_position_embeddings=16384)
    base.update(changes)
    return ModelConfig.from_spec("llama-3.1-8b").replace(**base)


def hf_reference(model: LlamaModel, dtype: torch.dtype | None = None):
    """transformers' LlamaForCausalLM holding `model`'s weights, on its device, in `dtype` (default: model's)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    p = next(model.parameters())
    dtype = dtype or p.dtype
    config = LlamaConfig.from_dict(model.cfg.hf_config_dict())
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(p.device):
            hf = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    missing, unexpected = hf.load_state_dict({k: v.to(dtype) for k, v in model.hf_state_dict().items()},
                                             strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    for m in hf.modules():  # both sides use the same fp32 inverse frequencies
        if hasattr(m, "inv_freq"):
            m.inv_freq = rope_inv_freq(model.cfg).to(p.device)
    return hf.eval()


@torch.inference_mode()
def hf_greedy(hf, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy continuation by recomputing the whole sequence each token (no cache to get wrong)."""
    ids = list(prompt)
    dev = next(hf.parameters()).device
    for _ in range(max_tokens):
        logits = hf(torch.tensor([ids], device=dev)).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(prompt):]


@torch.inference_mode()
def hf_logits(hf, ids: list[int]) -> torch.Tensor:
    """Logits (len(ids), vocab) in fp32, one causal forward pass."""
    dev = next(hf.parameters()).device
    return hf(torch.tensor([ids], device=dev)).logits[0].float()


def random_prompts(lengths, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]
