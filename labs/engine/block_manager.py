"""KV blocks for sequences: the paged cache's allocator and block tables, plus prefix caching.

Blocks come from labs/paged_attention's `BlockAllocator` (free list, reference counts) and
each sequence's list lives in its `BlockTables`. Two small subclasses add what prefix
caching needs and the kernel lab did not:

* A full block (block_size computed tokens) gets a chained hash: sha256 of its parent
  block's hash and its own token ids. Equal hashes mean equal tokens *and* equal
  everything before them, which is what makes the block's keys and values reusable. A
  partly filled block is never shared, so a sequence's next token always lands in a block
  it owns alone (no copy-on-write), as in vLLM 0.33 (`vllm/v1/core/kv_cache_utils.py`,
  `hash_block_tokens`; `vllm/v1/core/block_pool.py`).
* A freed block with a hash stays findable until it is handed out again. Freed cached
  blocks go to the back of the free list, so the least recently freed is evicted first;
  uncached ones go to the front, as the allocator already does.

A hit never covers the whole prompt: the last prompt token is always computed, because
its logits are what the first output token is sampled from (vLLM caps hits the same way).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict

from labs.paged_attention.cache import BlockAllocator, BlockTables, OutOfBlocksError
from labs.engine.sequence import Sequence


class _CachingAllocator(BlockAllocator):
    """A BlockAllocator whose freed, hashed blocks can be revived until they are reused.

    The free list is an insertion-ordered dict instead of the parent's deque, so reviving a
    cached block from the middle of it (`take`) is O(1): with a deque it cost a scan of the
    whole pool per hit, minutes of CPU for a fleet of 57,000-block pools.
    """

    def __init__(self, num_blocks: int):
        super().__init__(num_blocks)
        self._free = OrderedDict.fromkeys(range(1, num_blocks))  # front = handed out next
        self.hash_of: dict[int, bytes] = {}  # block -> hash, for blocks holding a full cached block
        self.block_of: dict[bytes, int] = {}  # hash -> block

    def allocate(self, n: int) -> list[int]:
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n > len(self._free):
            raise OutOfBlocksError(f"asked for {n} blocks but only {len(self._free)} are free "
                                   f"(pool of {self.num_blocks}, block 0 reserved as the null block)")
        blocks = [self._free.popitem(last=False)[0] for _ in range(n)]
        for b in blocks:  # handing a cached block out again evicts its hash
            self._refcount[b] = 1
            h = self.hash_of.pop(b, None)
            if h is not None:
                del self.block_of[h]
        return blocks

    def free(self, block_ids) -> None:
        """Uncached blocks go to the front (reused first); cached ones to the back (evicted last)."""
        for b in block_ids:
            self._check_id(b)
            if self._refcount[b] == 0:
                raise ValueError(f"block {b} is already free (double free)")
            self._refcount[b] -= 1
            if self._refcount[b] == 0:
                self._free[b] = None
                if b not in self.hash_of:
                    self._free.move_to_end(b, last=False)

    def take(self, b: int) -> None:
        """Add a reference to a cached block, taking it off the free list if it was there."""
        if self._refcount[b] == 0:
            del self._free[b]
            self._refcount[b] = 1
        else:
            self.share([b])


class _Tables(BlockTables):
    def start_with(self, seq_id: int, blocks: list[int]) -> None:
        """Begin a sequence with cached blocks already referenced for it (its first len*block_size tokens)."""
        if seq_id in self._blocks:
            raise ValueError(f"sequence {seq_id} already has blocks")
        self._blocks[seq_id] = list(blocks)
        self._lens[seq_id] = len(blocks) * self.block_size


def chain_hash(parent: bytes, tokens) -> bytes:
    return hashlib.sha256(parent + array("q", tokens).tobytes()).digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        """num_blocks is the pool size including the null block 0, so num_blocks - 1 are usable."""
        self.allocator = _CachingAllocator(num_blocks)
        self.tables = _Tables(self.allocator, block_size)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hit_tokens = 0  # prompt tokens served from the cache, over the manager's life

    # --- accounting -----------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (cached-but-unused blocks count: they are evictable)."""
        return self.allocator.num_free

    @property
    def num_usable(self) -> int:
        return self.allocator.num_usable

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, seq: Sequence) -> tuple[int, ...]:
        """seq's block table as it stands (the runner addresses the cache through it)."""
        return tuple(self.tables._blocks[seq.seq_id])

    def try_grow(self, seq: Sequence, n: int) -> bool:
        """Blocks for seq's next n tokens if the free list has them; False (and no change) if not.

        The scheduler calls this for every running sequence every step, so the common case
        (the next token fits the last block) touches only a length.
        """
        tables = self.tables
        sid = seq.seq_id
        blocks = tables._blocks.get(sid, [])
        new_len = seq.num_computed + n
        need = -(-new_len // self.block_size) - len(blocks)
        if need > 0:
            if need > self.allocator.num_free:
                return False
            blocks.extend(self.allocator.allocate(need))
        tables._blocks[sid] = blocks
        tables._lens[sid] = new_len
        return True

    # --- prefix cache -----------------------------------------------------------

    def _hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """The chained hashes of seq's first num_blocks full blocks (extended lazily, kept on seq)."""
        hs, bs = seq.block_hashes, self.block_size
        while len(hs) < num_blocks:
            i = len(hs)
            hs.append(chain_hash(hs[-1] if hs else b"", seq.token_ids[i * bs:(i + 1) * bs]))
        return hs[:num_blocks]

    # --8<-- [start:prefix]
    def lookup(self, seq: Sequence) -> list[int]:
        """Cached blocks for the longest run of seq's leading full blocks, never its last token."""
        if not self.enable_prefix_caching:
            return []
        hits = []
        for h in self._hashes(seq, (seq.num_tokens - 1) // self.block_size):
            b = self.allocator.block_of.get(h)
            if b is None:
                break
            hits.append(b)
        return hits
    # --8<-- [end:prefix]

    def blocks_to_admit(self, seq: Sequence, hits: list[int]) -> int:
        """Free blocks admission takes: new ones for the uncached tokens, plus hits now sitting free."""
        revived = sum(1 for b in hits if self.allocator.refcount(b) == 0)
        return self.blocks_for(seq.num_tokens) - len(hits) + revived

    # --- changes ---------------------------------------------------------------

    def admit(self, seq: Sequence, hits: list[int]) -> None:
        """Give seq its prefix-cache hits (maybe none); its cursor moves past them."""
        for b in hits:
            self.allocator.take(b)
        if hits:
            self.tables.start_with(seq.seq_id, hits)
        seq.num_computed = len(hits) * self.block_size
        self.hit_tokens += seq.num_computed

    def commit(self, seq: Sequence, computed_before: int) -> None:
        """After a step: register the blocks it filled (seq had computed_before tokens before it)."""
        if not self.enable_prefix_caching:
            return
        full = seq.num_computed // self.block_size
        blocks = self.tables._blocks[seq.seq_id]
        hashes = self._hashes(seq, full)
        for i in range(computed_before // self.block_size, full):
            b, h = blocks[i], hashes[i]
            if h not in self.allocator.block_of and b not in self.allocator.hash_of:
                self.allocator.block_of[h] = b
                self.allocator.hash_of[b] = h

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks (finish, abort or preemption); cached ones stay findable."""
        if seq.seq_id not in self.tables._blocks:
            return
        blocks = self.tables._blocks.pop(seq.seq_id)
        del self.tables._lens[seq.seq_id]
        self.allocator.free(reversed(blocks))  # tail first: the tail is evicted before the head
