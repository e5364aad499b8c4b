"""Part 4 lab: quantization error on Llama-8B layer shapes, GPTQ/AWQ/SmoothQuant, and decode-size GEMM speed."""
