"""Part 6 lab: many LoRA adapters in one batch, a per-adapter loop against segmented shrink/expand Triton kernels."""
