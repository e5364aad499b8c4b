"""PagedAttention decode lab: a paged KV cache, a Triton decode kernel, its reference and benchmark.

Importing this package imports nothing heavy; `cache.BlockAllocator` runs without torch.
"""
