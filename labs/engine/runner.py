"""Run one scheduled step on the device: pack tokens, attend through the paged cache, sample.

A step is a list of chunks (sequence, start, n). The runner packs their tokens into one
flat batch, computes each token's cache slot from the chunk's block table
(slot = block_ids[pos // block_size] * block_size + pos % block_size), and runs the model
with an attention callable that

1. writes every new token's K and V into the paged cache at its slot (`PagedKVCache.write`),
2. sends one-token chunks (decodes) through the paged decode kernel as one batch, and
3. sends each longer chunk (a prefill or a prefill chunk) through SDPA over its keys, gathered
   from the cache: the cached prefix plus the chunk itself, causally masked.

Logits are computed only for the rows that sample, as vLLM does.

CUDA graphs. A step of decodes only, at most `max_num_seqs` of them, replays a graph captured
for the next batch bucket (1, 2, 4, 8, ...): padding rows point at the null block and their
outputs are dropped. A captured step cannot read anything back from the device, so the
kernel is given its max_seq_len (the block table's capacity, max_model_len rounded up to a
block) and its split count (chosen once per bucket for that length) instead of reading
seq_lens. Splits past a short sequence's end are empty and weigh 0 in the reduction.

`cuda_graphs="emulate"` runs that same fixed-shape step (buckets, padding rows, the fixed
max_seq_len, and 2 splits so the reduction runs) eagerly on any device, so a CPU test checks
everything a captured step computes except the capture itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from labs.engine.config import EngineConfig, ModelConfig
from labs.engine.model import LlamaModel
from labs.engine.sampler import sample
from labs.engine.scheduler import SchedulerOutput
from labs.paged_attention.cache import NULL_BLOCK, PagedKVCache
from labs.paged_attention.reference import paged_decode_ref


def batch_buckets(max_num_seqs: int) -> list[int]:
    """Decode batch sizes a graph is captured for: powers of two, then max_num_seqs itself."""
    out, b = [], 1
    while b < max_num_seqs:
        out.append(b)
        b *= 2
    return out + [max_num_seqs]


class ModelRunner:
    def __init__(self, model: LlamaModel, engine: EngineConfig, *, decode_attention: str = "triton",
                 cuda_graphs: bool | str = True):
        """decode_attention: "triton" (labs/paged_attention's kernel) or "torch" (its gather-then-attend reference).
        cuda_graphs: True (capture on CUDA with the Triton kernel; off elsewhere), False, or "emulate".
        """
        if decode_attention not in ("triton", "torch"):
            raise ValueError(f"decode_attention must be 'triton' or 'torch', got {decode_attention!r}")
        if cuda_graphs not in (True, False, "emulate"):
            raise ValueError(f"cuda_graphs must be True, False or 'emulate', got {cuda_graphs!r}")
        cfg: ModelConfig = model.cfg
        p = next(model.parameters())
        self.model, self.engine, self.device, self.dtype = model, engine, p.device, p.dtype
        self.block_size = engine.block_size
        self.max_blocks = engine.blocks_per_seq  # block-table width
        self.cache = PagedKVCache(cfg.n_layers, engine.usable_blocks + 1, engine.block_size, cfg.n_kv_heads,
                                  cfg.head_dim, self.dtype, self.device)
        self.decode_attention = decode_attention
        self.emulate = cuda_graphs == "emulate"
        self.cuda_graphs = self.emulate or (cuda_graphs and self.device.type == "cuda" and decode_attention == "triton")
        self.graphs: dict[int, tuple] = {}  # bucket -> (CUDAGraph or None when emulated, buffers, step)
        self.generators: dict[int, torch.Generator] = {}
        self.last_logits: torch.Tensor | None = None  # (sampling rows, vocab), kept for tests

    # --- the decode kernel -------------------------------------------------------

    def _decode(self, layer: int, q, block_tables, seq_lens, max_seq_len: int, num_splits: int | None):
        kc, vc = self.cache.k[layer], self.cache.v[layer]
        if self.decode_attention == "torch":
            return paged_decode_ref(q, kc, vc, block_tables, seq_lens).to(q.dtype)
        from labs.paged_attention.kernel import paged_decode

        return paged_decode(q, kc, vc, block_tables, seq_lens, max_seq_len=max_seq_len, num_splits=num_splits)

    # --- one step --------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> list[int | None]:
        """Run the step; one sampled token per chunk that samples, None for the others."""
        chunks = out.chunks
        rows = [i for i, c in enumerate(chunks) if c.samples]
        if self.cuda_graphs and out.is_decode_only and len(chunks) <= self.engine.max_num_seqs:
            logits = self._replay(out)
        else:
            logits = self._eager(out, rows)
        self.last_logits = logits
        params = [chunks[i].seq.params for i in rows]
        gens = [self._generator(chunks[i].seq) for i in rows]
        tokens = sample(logits, params, gens).tolist() if rows else []
        result: list[int | None] = [None] * len(chunks)
        for i, t in zip(rows, tokens):
            result[i] = t
        return result

    def release(self, seq_id: int) -> None:
        """Forget a finished request's generator."""
        self.generators.pop(seq_id, None)

    def _generator(self, seq) -> torch.Generator | None:
        if seq.params.seed is None:
            return None
        g = self.generators.get(seq.seq_id)
        if g is None:
            g = self.generators[seq.seq_id] = torch.Generator(device=self.device).manual_seed(seq.params.seed)
        return g

    def _inputs(self, out: SchedulerOutput):
        """Packed token ids, positions and slots, built on the CPU and moved once."""
        bs = self.block_size
        ids, pos, slots = [], [], []
        for c in out.chunks:
            ids.extend(c.seq.token_ids[c.start:c.start + c.num_tokens])
            p = torch.arange(c.start, c.start + c.num_tokens)
            table = torch.tensor(c.block_ids, dtype=torch.long)
            pos.append(p)
            slots.append(table[p // bs] * bs + p % bs)
        to = dict(device=self.device, non_blocking=True)
        return (torch.tensor(ids, dtype=torch.long).to(**to), torch.cat(pos).to(**to), torch.cat(slots).to(**to))

    def _tables(self, chunks) -> tuple[torch.Tensor, torch.Tensor]:
        """Block tables (rows, max_blocks) int32 padded with the null block, and seq_lens int32."""
        table = torch.full((len(chunks), self.max_blocks), NULL_BLOCK, dtype=torch.int32)
        for r, c in enumerate(chunks):
            table[r, :len(c.block_ids)] = torch.tensor(c.block_ids, dtype=torch.int32)
        lens = torch.tensor([c.start + c.num_tokens for c in chunks], dtype=torch.int32)
        return table.to(self.device), lens.to(self.device)

    def _eager(self, out: SchedulerOutput, rows: list[int]) -> torch.Tensor:
        chunks = out.chunks
        ids, pos, slots = self._inputs(out)
        offsets, t = [], 0
        for c in chunks:
            offsets.append(t)
            t += c.num_tokens
        dec = [i for i, c in enumerate(chunks) if c.num_tokens == 1]
        pre = [i for i, c in enumerate(chunks) if c.num_tokens > 1]
        if dec:
            dec_idx = torch.tensor([offsets[i] for i in dec], device=self.device)
            dec_tables, dec_lens = self._tables([chunks[i] for i in dec])
            dec_max = max(chunks[i].start + 1 for i in dec)
        bs = self.block_size
        pre_blocks = {i: torch.tensor(chunks[i].block_ids, device=self.device) for i in pre}

        def attention(layer, q, k, v):
            self.cache.write(layer, slots, k, v)
            o = torch.empty_like(q)
            if dec:
                o[dec_idx] = self._decode(layer, q[dec_idx], dec_tables, dec_lens, dec_max, None)
            kc, vc = self.cache.k[layer], self.cache.v[layer]
            for i in pre:
                c, off = chunks[i], offsets[i]
                n, ctx = c.num_tokens, c.start + c.num_tokens
                blocks = pre_blocks[i][: -(-ctx // bs)]
                keys = kc[blocks].flatten(0, 1)[:ctx].transpose(0, 1)[None]  # (1, Hkv, ctx, d)
                vals = vc[blocks].flatten(0, 1)[:ctx].transpose(0, 1)[None]
                qi = q[off:off + n].transpose(0, 1)[None]  # (1, Hq, n, d)
                if c.start == 0:
                    oi = F.scaled_dot_product_attention(qi, keys, vals, is_causal=True, enable_gqa=True)
                else:  # query i sits at position start + i and sees keys 0 .. start + i
                    mask = (torch.arange(ctx, device=q.device)[None, :]
                            <= c.start + torch.arange(n, device=q.device)[:, None])
                    oi = F.scaled_dot_product_attention(qi, keys, vals, attn_mask=mask, enable_gqa=True)
                o[off:off + n] = oi[0].transpose(0, 1)
            return o

        hidden = self.model(ids, pos, attention)
        last = torch.tensor([offsets[i] + chunks[i].num_tokens - 1 for i in rows], dtype=torch.long, device=self.device)
        return self.model.logits(hidden[last]).float()

    # --- CUDA graphs for decode --------------------------------------------------------

    # --8<-- [start:replay]
    def _replay(self, out: SchedulerOutput) -> torch.Tensor:
        chunks = out.chunks
        n = len(chunks)
        bucket = next(b for b in batch_buckets(self.engine.max_num_seqs) if b >= n)
        if bucket not in self.graphs:
            self._capture(bucket)
        graph, buf, step = self.graphs[bucket]
        bs, pad = self.block_size, bucket - n
        values = {
            "ids": [c.seq.token_ids[c.start] for c in chunks] + [0] * pad,
            "pos": [c.start for c in chunks] + [0] * pad,
            "slots": [c.block_ids[c.start // bs] * bs + c.start % bs for c in chunks] + [NULL_BLOCK * bs] * pad,
            "table": [list(c.block_ids) + [NULL_BLOCK] * (self.max_blocks - len(c.block_ids)) for c in chunks]
                     + [[NULL_BLOCK] * self.max_blocks] * pad,
            "lens": [c.start + 1 for c in chunks] + [1] * pad,
        }
        for name, value in values.items():
            buf[name].copy_(torch.tensor(value, dtype=buf[name].dtype), non_blocking=True)
        if graph is None:
            buf["logits"] = step()
        else:
            graph.replay()
        return buf["logits"][:n].float()
    # --8<-- [end:replay]

    def _capture(self, bucket: int) -> None:
        from labs.paged_attention.kernel import choose_num_splits, sm_count

        dev = self.device
        buf = {"ids": torch.zeros(bucket, dtype=torch.long, device=dev),
               "pos": torch.zeros(bucket, dtype=torch.long, device=dev),
               "slots": torch.zeros(bucket, dtype=torch.long, device=dev),
               "table": torch.zeros(bucket, self.max_blocks, dtype=torch.int32, device=dev),
               "lens": torch.ones(bucket, dtype=torch.int32, device=dev)}
        max_len = self.max_blocks * self.block_size
        if self.emulate:
            splits = 2
        else:
            splits = choose_num_splits(bucket, self.model.cfg.n_kv_heads, max_len, sm_count(dev.index or 0))

        def attention(layer, q, k, v):
            self.cache.write(layer, buf["slots"], k, v)
            return self._decode(layer, q, buf["table"], buf["lens"], max_len, splits)

        def step():
            return self.model.logits(self.model(buf["ids"], buf["pos"], attention))

        if self.emulate:
            self.graphs[bucket] = (None, buf, step)
            return
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # compile the kernels and settle the allocator outside the capture
                step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # its own memory pool: buckets are captured lazily, in any order
            buf["logits"] = step()
        self.graphs[bucket] = (graph, buf, step)
