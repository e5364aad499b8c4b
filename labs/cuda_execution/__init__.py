"""Execution-model lab: SIMT divergence and occupancy, measured with small CUDA kernels."""
