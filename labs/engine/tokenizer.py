"""Text to token ids and back: UTF-8 bytes for random weights, the checkpoint's own tokenizer for real ones.

A weights folder without a tokenizer.json gets the byte tokenizer too (the tests write such
folders); its ids still go through the real model.

Random weights have no vocabulary, so any reversible map will do; bytes are the simplest
(id = byte value, 0..255). A model with random weights still samples ids above 255; they
decode as U+FFFD, so output text shows that the ids were not bytes.
"""

from __future__ import annotations

from pathlib import Path


class ByteTokenizer:
    eos_token_ids: tuple[int, ...] = ()

    def __init__(self, vocab_size: int):
        if vocab_size < 256:
            raise ValueError(f"a byte tokenizer needs a vocabulary of at least 256 ids, got {vocab_size}")

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        out, run = [], bytearray()
        for i in ids:
            if i < 256:
                run.append(i)
                continue
            out.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            out.append("\ufffd")
        out.append(run.decode("utf-8", errors="replace"))
        return "".join(out)


class HFTokenizer:
    """tokenizer.json from a Hugging Face folder, through the `tokenizers` package."""

    def __init__(self, folder: str | Path, eos_token_ids: tuple[int, ...] = ()):
        from tokenizers import Tokenizer

        path = Path(folder) / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"--weights {folder}: no tokenizer.json in it")
        self._tok = Tokenizer.from_file(str(path))
        self.eos_token_ids = eos_token_ids

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=True).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)
