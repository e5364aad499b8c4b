"""One row of the lab per vocabulary size: build, check, time, sample.

Everything printed or recorded comes from here: the automaton's size, the cost of the masks
(precomputed for every state, or built per step), a check of the masks against a byte-by-byte
walk, and N samples per model with and without the mask, parsed and checked.
"""

from __future__ import annotations

import json
import time

import numpy as np

from labs.structured import automaton, masks, sampling, schema, vocab
from labs.structured.automaton import DEAD

STRUCTURAL = set(b'{}[]:,"')


def spans_boundary(token: bytes) -> bool:
    """A token with a quote and another JSON delimiter in it, such as `":"` or `"],"`, ends one grammar part and starts the next."""
    return b'"' in token and len(set(token) & STRUCTURAL) >= 2


def walk_check(dfa, next_state: np.ndarray, token_bytes: list[bytes], states) -> int:
    """Mismatches between the precomputed table and a plain byte-by-byte walk, over the given states."""
    bad = 0
    for s in states:
        for t, b in enumerate(token_bytes):
            want = dfa.walk(b, s) if b else DEAD
            bad += int(next_state[s, t] != want)
    return bad


def _per_call_us(fn, calls: list, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for args in calls:
            fn(*args)
        best = min(best, (time.perf_counter() - t0) / len(calls))
    return best * 1e6


def _truth(text: bytes) -> bool:
    value = json.loads(text)
    return vocab.TRUE_COUNTRY.get(value["city"]) == value["country"]


def evaluate(samples: list[sampling.Sample], v: vocab.Vocab, sch: dict) -> dict:
    parsed = conform = true = 0
    for s in samples:
        s.text = v.decode(s.ids)
        p, c = schema.conforms(s.text.decode("utf-8", "replace"), sch)
        parsed += p
        conform += c
        true += c and _truth(s.text)
    return {"parsed": parsed, "conform": conform, "true": true, "finished": sum(s.finished for s in samples),
            "mean_tokens": round(float(np.mean([len(s.ids) for s in samples])), 1)}


def run_one(vocab_size: int, lines: list[str], n_samples: int, seed: int, log=print) -> dict:
    t0 = time.perf_counter()
    v = vocab.train(vocab_size, lines)
    train_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    pattern = schema.to_regex(vocab.SCHEMA)
    dfa = automaton.compile_pattern(pattern)
    compile_ms = (time.perf_counter() - t0) * 1e3

    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        walker = masks.Walker(dfa, v.token_bytes)
        next_state = walker.precompute()
        best = min(best, time.perf_counter() - t0)
    precompute_ms = best * 1e3
    rng = np.random.default_rng(seed)
    check_states = sorted(set(rng.choice(dfa.n_states, size=min(12, dfa.n_states), replace=False).tolist()) | {0})
    mismatches = walk_check(dfa, next_state, v.token_bytes, check_states)

    # samples: each model, masked and free
    encoded = [[*v.encode(line), v.eos_id] for line in lines if line.startswith("{")]
    models = {"random": sampling.RandomLogits(v.size), "bigram": sampling.Bigram(v.size, encoded, v.eos_id)}
    results, visited_states = {}, []
    for name, model in models.items():
        for mode, table in (("constrained", next_state), ("free", None)):
            srng = np.random.default_rng([seed, vocab_size, len(name), len(mode)])
            batch = [sampling.decode(model, dfa, table, v.eos_id, srng) for _ in range(n_samples)]
            results[f"{name}_{mode}"] = evaluate(batch, v, vocab.SCHEMA)
            if mode == "constrained":
                for s in batch:
                    st = 0
                    for t in s.ids:
                        visited_states.append(st)
                        st = int(next_state[st, t])
                if name == "bigram":
                    bigram_batch = batch
    used = {t for s in bigram_batch for t in s.ids}
    boundary_used = sorted(v.token_bytes[t].decode() for t in used if spans_boundary(v.token_bytes[t]))
    false_example = next((s.text.decode() for s in bigram_batch
                          if schema.conforms(s.text.decode(), vocab.SCHEMA)[1] and not _truth(s.text)), None)

    # per-step cost, over the states real constrained samples pass through
    steps = [visited_states[i] for i in rng.integers(0, len(visited_states), size=400)]
    logits = rng.normal(size=v.size)
    accepting = dfa.accepting
    trie = masks.TokenTrie(v.token_bytes)

    def lookup(s):
        masks.apply(logits, masks.allowed(next_state[s].copy(), bool(accepting[s]), v.eos_id))

    def lazy(s):
        masks.apply(logits, masks.allowed(walker.row(s), bool(accepting[s]), v.eos_id))

    def walk(s):
        r, _ = trie.row(dfa, s, v.size)
        masks.apply(logits, masks.allowed(r, bool(accepting[s]), v.eos_id))

    calls = [(s,) for s in steps]
    step = {"lookup_us": _per_call_us(lookup, calls), "lazy_us": _per_call_us(lazy, calls[:100]),
            "trie_us": _per_call_us(walk, calls[:100])}
    trie_free = max(trie.row(dfa, s, v.size)[1] for s in set(steps))
    allowed_counts = (next_state[sorted(set(steps))] >= 0).sum(axis=1)

    row = {
        "vocab_size": vocab_size, "tokens": v.size, "states": dfa.n_states, "pattern_chars": len(pattern),
        "train_s": round(train_s, 2), "compile_ms": round(compile_ms, 1), "precompute_ms": round(precompute_ms, 1),
        "table_bytes": int(next_state.nbytes), "packed_mask_bytes": dfa.n_states * masks.packed_bytes(v.size),
        "step_lookup_us": round(step["lookup_us"], 1), "step_lazy_us": round(step["lazy_us"], 1),
        "step_trie_us": round(step["trie_us"], 1), "trie_nodes": len(trie.children),
        "trie_max_visited": int(trie_free), "allowed_min": int(allowed_counts.min()),
        "allowed_max": int(allowed_counts.max()), "mask_checked_states": len(check_states),
        "mask_mismatches": mismatches, "samples": n_samples, "boundary_tokens_in_vocab":
            sum(spans_boundary(b) for b in v.token_bytes), "boundary_tokens_used": boundary_used,
        "false_example": false_example,
        **{f"{run}_{field}": value for run, r in results.items() for field, value in r.items()},
    }
    ok = (mismatches == 0 and results["random_constrained"]["conform"] == n_samples
          and results["bigram_constrained"]["conform"] == n_samples)
    row["ok"] = bool(ok)
    log(f"V={v.size:>6} states={dfa.n_states} precompute={precompute_ms:.1f} ms step: lookup "
        f"{step['lookup_us']:.1f} us, lazy {step['lazy_us']:.1f} us, trie {step['trie_us']:.1f} us; "
        f"constrained valid {results['random_constrained']['conform']}/{n_samples} (random), "
        f"{results['bigram_constrained']['conform']}/{n_samples} (bigram, {results['bigram_constrained']['true']} true); "
        f"free valid {results['random_free']['conform']}/{n_samples} (random), "
        f"{results['bigram_free']['conform']}/{n_samples} (bigram)")
    return row
