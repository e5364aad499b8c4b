"""Triton tutorial lab: vector add, fused softmax and tiled matmul, each checked against torch."""
