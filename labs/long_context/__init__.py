"""Long context: RoPE scaling rules (rope.py), the KV wall (the cost model's max_context), decode time vs context (decode_bench.py)."""
