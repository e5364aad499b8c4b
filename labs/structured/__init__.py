"""Structured decoding on the CPU: a JSON-schema subset -> regex -> DFA -> a per-step token mask over a real BPE vocabulary.

`python -m labs.structured --help`. Nothing here needs a GPU or vLLM; `tokenizers` (the
`labs` extra) trains the vocabularies on text the lab generates itself.
"""
