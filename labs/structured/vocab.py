"""The text the lab trains its BPE vocabularies on, generated here (nothing is downloaded), and the trained tokens as bytes.

The corpus mixes compact JSON records about cities (true ones, from `FACTS`) with sentences
of made-up words drawn with Zipf frequencies. The records teach the BPE the tokens real
tokenizers have for JSON, the ones that span grammar boundaries (`":"`, `","`, `":["`, `"}`);
the made-up words give it enough distinct text to fill 16K merges.

Tokenization is byte-level BPE with GPT-2's pre-tokenizer rule, as Llama 3 and GPT-4 class
tokenizers use: punctuation runs stay together, so `","` can become one token.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass

# (city, country, languages): true facts; the valid-but-false check compares samples with them.
FACTS = (
    ("Paris", "France", ("French",)), ("Lyon", "France", ("French",)), ("Marseille", "France", ("French",)),
    ("Tokyo", "Japan", ("Japanese",)), ("Osaka", "Japan", ("Japanese",)), ("Kyoto", "Japan", ("Japanese",)),
    ("Nairobi", "Kenya", ("Swahili", "English")), ("Mombasa", "Kenya", ("Swahili", "English")),
    ("Toronto", "Canada", ("English", "French")), ("Montreal", "Canada", ("French", "English")),
    ("Vancouver", "Canada", ("English",)), ("Lima", "Peru", ("Spanish", "Quechua")),
    ("Cusco", "Peru", ("Spanish", "Quechua")), ("Recife", "Brazil", ("Portuguese",)),
    ("Manaus", "Brazil", ("Portuguese",)), ("Porto", "Portugal", ("Portuguese",)),
    ("Lisbon", "Portugal", ("Portuguese",)), ("Hanoi", "Vietnam", ("Vietnamese",)),
    ("Hue", "Vietnam", ("Vietnamese",)), ("Oslo", "Norway", ("Norwegian",)), ("Bergen", "Norway", ("Norwegian",)),
)
COUNTRIES = tuple(sorted({c for _, c, _ in FACTS}))
LANGUAGES = tuple(sorted({lang for *_, langs in FACTS for lang in langs}))
TRUE_COUNTRY = {city: country for city, country, _ in FACTS}

# The lab's schema: every property kind of the subset but nesting.
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "country": {"enum": list(COUNTRIES)},
        "population_k": {"type": "integer"},
        "languages": {"type": "array", "items": {"enum": list(LANGUAGES)}, "maxItems": 3},
        "capital": {"type": "boolean"},
    },
    "required": ["city", "country", "population_k", "languages", "capital"],
}
CAPITALS = {"Paris", "Tokyo", "Nairobi", "Lima", "Lisbon", "Hanoi", "Oslo"}

EOS = "<eos>"


def record(rng: random.Random) -> str:
    city, country, langs = rng.choice(FACTS)
    return json.dumps({"city": city, "country": country, "population_k": rng.randint(50, 14000),
                       "languages": list(langs), "capital": city in CAPITALS}, separators=(",", ":"))


def _words(rng: random.Random, n: int) -> list[str]:
    onsets = "b c d f g h j k l m n p r s t v w z br tr st pl kr sh ch th".split()
    vowels = "a e i o u ai ou ea".split()
    codas = ["", "", "n", "r", "s", "l", "t", "m"]
    seen: set[str] = set()
    while len(seen) < n:
        w = "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 4)))
        seen.add(w)
    return sorted(seen)


def corpus(lines: int, seed: int = 0, distinct_words: int = 40_000) -> list[str]:
    """`lines` lines: half JSON records, half sentences of Zipf-distributed made-up words."""
    rng = random.Random(seed)
    words = _words(rng, distinct_words)
    cumulative = list(itertools.accumulate(1 / (i + 1) for i in range(len(words))))
    out = []
    for i in range(lines):
        if i % 2 == 0:
            out.append(record(rng))
        else:
            sent = rng.choices(words, cum_weights=cumulative, k=rng.randint(6, 18))
            out.append(" ".join(sent).capitalize() + rng.choice([".", ".", ",", "?", ";", ":"]))
    return out


def _byte_decoder() -> dict[str, int]:
    """The inverse of byte-level BPE's byte -> printable-character map (printable bytes map to themselves)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


@dataclass
class Vocab:
    """A trained tokenizer and every token's bytes; `eos_id` is the one special token."""

    tokenizer: object
    token_bytes: list[bytes]
    eos_id: int

    @property
    def size(self) -> int:
        return len(self.token_bytes)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids) -> bytes:
        return b"".join(self.token_bytes[i] for i in ids if i != self.eos_id)


def train(vocab_size: int, lines: list[str]) -> Vocab:
    """A byte-level BPE of `vocab_size` tokens (the 256 bytes, the merges, and <eos>) trained on `lines`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    decoder = _byte_decoder()
    vocab = tok.get_vocab()
    token_bytes = [b""] * len(vocab)
    for text, i in vocab.items():
        token_bytes[i] = b"" if text == EOS else bytes(decoder[c] for c in text)
    return Vocab(tok, token_bytes, vocab[EOS])
