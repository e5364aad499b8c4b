"""What the CUDA and Triton labs of Part 3 share: building CUDA, timing, the environment, the record.

Each piece is torch-free at import, so the CPU tests and the site build can load it.
"""
