"""Run one scheduled step on the device: pack tokens, attend through the paged cache, sample.

A step is a list of chunks (sequence, start, n). The runner packs their tokens into one
flat batch, computes each token's cache slot from the chunk's block table
(slot = block_ids[pos // block_size] * block_size + pos % block_size), and runs the model
with an attention callable that

1. writes every new token's K and V into the paged cache at its slot: inside the fused RoPE
   kernel on CUDA (`fused.rope_and_cache`, through the callable's `kv_target`), else with
   `PagedKVCache.write`, and
2. on CUDA with the Triton kernels (`mixed_attention="varlen"`), attends for every chunk of
   the step, prefill chunks and decodes alike, in one launch per layer
   (`varlen.varlen_paged_attention`, which reads all keys through the block tables);
3. otherwise (`"split"`, the CPU default) sends one-token chunks (decodes) through the paged
   decode kernel as one batch and each longer chunk through SDPA over its keys, gathered from
   the cache: the cached prefix plus the chunk itself, causally masked.

Logits are computed only for the rows that sample, as vLLM does.

Host to device. A step's integer inputs (token ids, positions, slots, block tables, chunk
offsets) are packed on the host into one pinned int32 buffer and moved with one copy; the
only wait on the device is the read of the sampled tokens.

CUDA graphs. A step of decodes only, at most `max_num_seqs` of them, replays a graph captured
for the next batch bucket (1, 2, 4, 8, ...): padding rows point at the null block and their
outputs are dropped. A captured step cannot read anything back from the device, so the
kernel is given its max_seq_len (the block table's capacity, max_model_len rounded up to a
block) and its split count (chosen once per bucket for that length) instead of reading
seq_lens. Splits past a short sequence's end are empty and weigh 0 in the reduction.

The graph also takes the argmax of the logits: a greedy batch reads its tokens from there
and launches nothing after the replay but that one read.

`cuda_graphs="emulate"` runs that same fixed-shape step (buckets, padding rows, the fixed
max_seq_len, and 2 splits so the reduction runs) eagerly on any device, so a CPU test checks
everything a captured step computes except the capture itself.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from labs.engine.config import EngineConfig, ModelConfig
from labs.engine.model import LlamaModel
from labs.engine.sampler import sample
from labs.engine.scheduler import SchedulerOutput
from labs.paged_attention.cache import NULL_BLOCK, PagedKVCache
from labs.paged_attention.reference import paged_decode_ref


ALIGN = 16  # int32 elements: each slice of a packed input starts on a 64-byte boundary


def packed_offsets(sizes: list[int]) -> tuple[list[int], int]:
    """Where each of several int32 arrays starts in one packed buffer, and the buffer's length.

    Triton compiles a kernel once per pointer alignment (16 bytes or not): slices at arbitrary
    offsets would compile new variants in the middle of a timed run.
    """
    offsets, end = [], 0
    for n in sizes:
        offsets.append(end)
        end += -(-n // ALIGN) * ALIGN
    return offsets, end


def batch_buckets(max_num_seqs: int) -> list[int]:
    """Decode batch sizes a graph is captured for: powers of two, then max_num_seqs itself."""
    out, b = [], 1
    while b < max_num_seqs:
        out.append(b)
        b *= 2
    return out + [max_num_seqs]


class ModelRunner:
    def __init__(self, model: LlamaModel, engine: EngineConfig, *, decode_attention: str = "triton",
                 cuda_graphs: bool | str = True, mixed_attention: str = "auto"):
        """decode_attention: "triton" (labs/paged_attention's kernel) or "torch" (its gather-then-attend reference).
        cuda_graphs: True (capture on CUDA with the Triton kernel; off elsewhere), False, or "emulate".
        mixed_attention: how a step that is not a captured decode attends: "varlen" (one kernel for
        all chunks), "split" (decode kernel plus SDPA per prefill chunk), or "auto" (varlen on CUDA
        with decode_attention "triton", split elsewhere).
        """
        if decode_attention not in ("triton", "torch"):
            raise ValueError(f"decode_attention must be 'triton' or 'torch', got {decode_attention!r}")
        if cuda_graphs not in (True, False, "emulate"):
            raise ValueError(f"cuda_graphs must be True, False or 'emulate', got {cuda_graphs!r}")
        if mixed_attention not in ("auto", "varlen", "split"):
            raise ValueError(f"mixed_attention must be 'auto', 'varlen' or 'split', got {mixed_attention!r}")
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
        if mixed_attention == "auto":
            mixed_attention = "varlen" if self.device.type == "cuda" and decode_attention == "triton" else "split"
        self.varlen = mixed_attention == "varlen"
        self.graphs: dict[int, tuple] = {}  # bucket -> (CUDAGraph or None when emulated, buffers, step)
        self._staging: torch.Tensor | None = None  # pinned int32 host buffer for a step's inputs
        self._staged: torch.cuda.Event | None = None  # recorded after the last copy out of it
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
        params = [chunks[i].seq.params for i in rows]
        greedy = None
        if self.cuda_graphs and out.is_decode_only and len(chunks) <= self.engine.max_num_seqs:
            logits = self._replay(out)
            argmax = self.graphs[self._bucket(len(chunks))][1]["argmax"]
            if len(rows) < len(chunks):  # a one-token prompt chunk that does not reach the prompt's end
                index = torch.tensor(rows, device=self.device)
                logits, argmax = logits[index], argmax[index]
            if all(p.greedy for p in params):
                greedy = argmax[:len(rows)]
        else:
            logits = self._eager(out, rows)
        self.last_logits = logits  # (sampling rows, vocab); a graph's buffer: valid until the next step
        if greedy is not None:
            tokens = greedy.tolist()
        elif rows:
            gens = [self._generator(chunks[i].seq) for i in rows]
            tokens = sample(logits, params, gens).tolist()
        else:
            tokens = []
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

    def _stage(self, values: np.ndarray, dst: torch.Tensor | None = None) -> torch.Tensor:
        """Move a step's int32 inputs to the device in one copy (into `dst` when given), through a pinned buffer."""
        n = values.size
        if self.device.type != "cuda":
            host = torch.from_numpy(values)
            return host.clone() if dst is None else dst.copy_(host)
        if self._staged is not None:
            self._staged.synchronize()  # the last copy out of the buffer has finished
        if self._staging is None or self._staging.numel() < n:
            self._staging = torch.empty(max(n, 2 * (0 if self._staging is None else self._staging.numel()), 1 << 16),
                                        dtype=torch.int32, pin_memory=True)
        host = self._staging[:n]
        host.numpy()[:] = values
        dev = torch.empty(n, dtype=torch.int32, device=self.device) if dst is None else dst
        dev.copy_(host, non_blocking=True)
        if self._staged is None:
            self._staged = torch.cuda.Event()
        self._staged.record()
        return dev

    def _eager_inputs(self, chunks, rows: list[int]) -> dict[str, torch.Tensor]:
        """Every input of an eager step, packed into one int32 array, moved once, then sliced."""
        bs, mb = self.block_size, self.max_blocks
        sizes = [c.num_tokens for c in chunks]
        t, n = sum(sizes), len(chunks)
        q_start = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(sizes, out=q_start[1:])
        ids = np.empty(t, dtype=np.int64)
        pos = np.empty(t, dtype=np.int64)
        table = np.full((n, mb), NULL_BLOCK, dtype=np.int64)
        for r, c in enumerate(chunks):
            a, b = q_start[r], q_start[r + 1]
            ids[a:b] = c.seq.token_ids[c.start:c.start + c.num_tokens]
            pos[a:b] = np.arange(c.start, c.start + c.num_tokens)
            table[r, :len(c.block_ids)] = c.block_ids
        row = np.repeat(np.arange(n), sizes)
        slots = table[row, pos // bs] * bs + pos % bs
        starts = np.array([c.start for c in chunks], dtype=np.int64)
        last = q_start[1:][rows] - 1 if rows else np.zeros(0, dtype=np.int64)
        parts = {"ids": ids, "pos": pos, "slots": slots, "last": last, "table": table.ravel(), "q_start": q_start,
                 "ctx_start": starts, "lens": starts + np.asarray(sizes)}
        if self.varlen:
            from labs.engine.varlen import block_q, tile_list

            cfg = self.model.cfg
            parts["tiles"] = np.asarray(tile_list(sizes, block_q(cfg.n_heads, cfg.n_kv_heads)), dtype=np.int64)
        offsets, total = packed_offsets([a.size for a in parts.values()])
        host = np.zeros(total, dtype=np.int32)
        for off, arr in zip(offsets, parts.values()):
            host[off:off + arr.size] = arr
        dev = self._stage(host)
        views = {name: dev[off:off + arr.size] for off, (name, arr) in zip(offsets, parts.items())}
        views["table"] = views["table"].view(n, mb)
        if self.varlen:
            views["tiles"] = views["tiles"].view(-1, 2)
        return views

    def _eager(self, out: SchedulerOutput, rows: list[int]) -> torch.Tensor:
        chunks = out.chunks
        x = self._eager_inputs(chunks, rows)
        slots = x["slots"]
        if self.varlen:
            from labs.engine.varlen import varlen_paged_attention

            def attention(layer, q, k, v):
                if k is not None:
                    self.cache.write(layer, slots, k, v)
                return varlen_paged_attention(q, self.cache.k[layer], self.cache.v[layer], x["table"], x["q_start"],
                                              x["ctx_start"], x["tiles"])
        else:
            attention = self._split_attention(chunks, x)
        attention.kv_target = self._kv_target(slots)
        hidden = self.model(x["ids"], x["pos"], attention)
        return self.model.logits(hidden[x["last"].long()]).float()

    def _kv_target(self, slots):
        """For the fused model: where layer i's k and v go (None for an fp8 cache, which `write` scales)."""
        if self.cache.is_fp8:
            return None
        return lambda layer: (self.cache.k[layer], self.cache.v[layer], slots)

    def _split_attention(self, chunks, x):
        """Decodes through the paged decode kernel, each longer chunk through SDPA over its gathered keys."""
        offsets, t = [], 0
        for c in chunks:
            offsets.append(t)
            t += c.num_tokens
        dec = [i for i, c in enumerate(chunks) if c.num_tokens == 1]
        pre = [i for i, c in enumerate(chunks) if c.num_tokens > 1]
        if dec:
            dec_idx = torch.tensor([offsets[i] for i in dec], device=self.device)
            dec_tables = x["table"][dec_idx.new_tensor(dec)] if len(dec) < len(chunks) else x["table"]
            dec_lens = x["lens"][dec_idx.new_tensor(dec)] if len(dec) < len(chunks) else x["lens"]
            dec_max = max(chunks[i].start + 1 for i in dec)
        bs = self.block_size
        slots = x["slots"]

        def attention(layer, q, k, v):
            if k is not None:
                self.cache.write(layer, slots, k, v)
            o = torch.empty_like(q)
            if dec:
                o[dec_idx] = self._decode(layer, q[dec_idx], dec_tables.contiguous(), dec_lens.contiguous(), dec_max,
                                          None)
            kc, vc = self.cache.k[layer], self.cache.v[layer]
            for i in pre:
                c, off = chunks[i], offsets[i]
                n, ctx = c.num_tokens, c.start + c.num_tokens
                blocks = x["table"][i, : -(-ctx // bs)].long()
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

        return attention

    # --- CUDA graphs for decode --------------------------------------------------------

    def _bucket(self, n: int) -> int:
        return next(b for b in batch_buckets(self.engine.max_num_seqs) if b >= n)

    # --8<-- [start:replay]
    def _replay(self, out: SchedulerOutput) -> torch.Tensor:
        chunks = out.chunks
        n = len(chunks)
        bucket = self._bucket(n)
        if bucket not in self.graphs:
            self._capture(bucket)
        graph, buf, step = self.graphs[bucket]
        bs, mb = self.block_size, self.max_blocks
        (o_ids, o_pos, o_slots, o_lens, o_table), total = packed_offsets([bucket] * 4 + [bucket * mb])
        host = np.zeros(total, dtype=np.int32)  # padding rows: token 0 at the null block's slot 0
        ids, pos, slots, lens = (host[o:o + bucket] for o in (o_ids, o_pos, o_slots, o_lens))
        table = host[o_table:o_table + bucket * mb].reshape(bucket, mb)  # padding entries: the null block (0)
        lens[n:] = 1
        for r, c in enumerate(chunks):
            p = c.start
            ids[r], pos[r], lens[r] = c.seq.token_ids[p], p, p + 1
            slots[r] = c.block_ids[p // bs] * bs + p % bs
            table[r, :len(c.block_ids)] = c.block_ids
        self._stage(host, buf["meta"])
        if graph is None:
            buf["logits"], buf["argmax"] = step()
        else:
            graph.replay()
        return buf["logits"][:n]
    # --8<-- [end:replay]

    def _capture(self, bucket: int) -> None:
        from labs.paged_attention.kernel import choose_num_splits, sm_count

        dev, mb = self.device, self.max_blocks
        (o_ids, o_pos, o_slots, o_lens, o_table), total = packed_offsets([bucket] * 4 + [bucket * mb])
        meta = torch.zeros(total, dtype=torch.int32, device=dev)
        buf = {"meta": meta, "ids": meta[o_ids:o_ids + bucket], "pos": meta[o_pos:o_pos + bucket],
               "slots": meta[o_slots:o_slots + bucket], "lens": meta[o_lens:o_lens + bucket],
               "table": meta[o_table:o_table + bucket * mb].view(bucket, mb)}
        buf["lens"].fill_(1)
        max_len = mb * self.block_size
        if self.emulate:
            splits = 2
        else:
            splits = choose_num_splits(bucket, self.model.cfg.n_kv_heads, max_len, sm_count(dev.index or 0))

        def attention(layer, q, k, v):
            if k is not None:
                self.cache.write(layer, buf["slots"], k, v)
            return self._decode(layer, q, buf["table"], buf["lens"], max_len, splits)

        attention.kv_target = self._kv_target(buf["slots"])

        def step():
            logits = self.model.logits(self.model(buf["ids"], buf["pos"], attention))
            return logits, logits.argmax(dim=-1)

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
            buf["logits"], buf["argmax"] = step()
        self.graphs[bucket] = (graph, buf, step)
