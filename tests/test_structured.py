"""The structured-decoding lab (labs/structured): the automaton, the masks and the guarantee they give.

The masks are held against references that share none of their code: Python's `re` for
what the DFA matches, and Brzozowski derivatives of the regex tree for which prefixes can
still be completed. A tiny BPE is trained once per module on the lab's own generated text.
"""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from labs.structured import automaton, lab, masks, regex, sampling, schema, vocab  # noqa: E402
from labs.structured.automaton import DEAD  # noqa: E402

SMALL = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                          "country": {"enum": ["France", "Japan", "Peru"]},
                                          "n": {"type": "integer"}},
         "required": ["city", "country", "n"]}


@pytest.fixture(scope="module")
def v():
    return vocab.train(400, vocab.corpus(1500, seed=1, distinct_words=400))


@pytest.fixture(scope="module")
def full():
    return automaton.compile_pattern(schema.to_regex(vocab.SCHEMA))


def _sample_match(dfa, rng) -> bytes:
    """A random string the DFA accepts: a walk that stops at an accepting state with some chance."""
    out, s = [], 0
    while True:
        if dfa.accepting[s] and (rng.random() < 0.3 or not (dfa.table[s] >= 0).any()):
            return bytes(out)
        choices = np.nonzero(dfa.table[s] >= 0)[0]
        b = int(rng.choice(choices))
        out.append(b)
        s = int(dfa.table[s, b])


@pytest.mark.parametrize("pattern", ["ab*c", "(a|bc){1,3}d?", r"-?(0|[1-9]\d{0,3})", r"\[(x(,x){0,2})?\]",
                                     r"\{\"k\":\"[ !#-\[\]-~]{0,3}\"\}", "(true|false)"])
def test_dfa_matches_what_python_re_matches(pattern):
    dfa = automaton.compile_pattern(pattern)
    ref = re.compile(pattern)
    rng = random.Random(pattern)
    alphabet = sorted(set(re.sub(r"[\\{}\[\]()|*+?,\d-]", "", pattern)) | set('abcdx,-019{}[]":k '))
    strings = [_sample_match(dfa, rng) for _ in range(200)]
    strings += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))).encode() for _ in range(2000)]
    strings += [s[:i] + s[i + 1:] for s in strings[:200] for i in range(len(s))]  # one byte dropped
    for s in strings:
        assert dfa.matches(s) == bool(ref.fullmatch(s.decode())), (pattern, s)
    # trimmed: every state left can still reach acceptance
    assert all(regex.viable(regex.parse(pattern), _sample_match(dfa, rng)) for _ in range(20))


@pytest.mark.parametrize("bad", ["(ab", "a{3,1}", "[a-", "a{99}", r"\q", "*a", "é"])
def test_bad_patterns_are_refused(bad):
    with pytest.raises(regex.RegexError):
        regex.parse(bad)


def test_schema_regex_accepts_exactly_what_the_checker_accepts(full):
    rng = random.Random(3)
    for _ in range(300):
        city, country, langs = rng.choice(vocab.FACTS)
        value = {"city": city[: rng.randint(0, 12)], "country": rng.choice(vocab.COUNTRIES),
                 "population_k": rng.choice([0, 7, -12, 123456789]), "languages": list(langs)[:3],
                 "capital": rng.random() < 0.5}
        text = json.dumps(value, separators=(",", ":"))
        assert full.matches(text.encode()) and schema.conforms(text, vocab.SCHEMA) == (True, True)
        broken = dict(value)
        mutation = rng.randrange(4)
        if mutation == 0:
            broken["country"] = "Atlantis"
        elif mutation == 1:
            broken.pop("capital")
        elif mutation == 2:
            broken["population_k"] = "12"
        else:
            broken["languages"] = ["French"] * 4
        text = json.dumps(broken, separators=(",", ":"))
        assert not full.matches(text.encode()) and not schema.conforms(text, vocab.SCHEMA)[1]


def test_schema_outside_the_subset_is_refused():
    for bad in ({"type": "number"}, {"type": "object", "properties": {"a": {"type": "string"}}, "required": []},
                {"enum": []}, {"type": "string", "maxLength": 999}):
        with pytest.raises(schema.SchemaError):
            schema.to_regex(bad)


def _prefix_states(dfa, v, values, rng):
    """(bytes so far, DFA state) at every token boundary of the encoded values."""
    out = []
    for value in values:
        ids = v.encode(json.dumps(value, separators=(",", ":")))
        s, done = 0, b""
        for t in ids:
            out.append((done, s))
            done += v.token_bytes[t]
            s = dfa.walk(v.token_bytes[t], s)
            assert s != DEAD
    return rng.sample(out, min(40, len(out)))


def test_mask_is_exactly_the_completable_tokens(v):
    """Allowed iff prefix + token can still become a conforming output: nothing completable excluded, nothing else let in."""
    tree = regex.parse(schema.to_regex(SMALL))
    dfa = automaton.compile_tree(tree)
    table = masks.Walker(dfa, v.token_bytes).precompute()
    rng = random.Random(5)
    values = [{"city": c[:6], "country": k, "n": rng.randint(-99, 9999)} for c, k, _ in vocab.FACTS
              if k in ("France", "Japan", "Peru")]
    for done, s in _prefix_states(dfa, v, values, rng):
        node = tree
        for b in done:
            node = regex.derivative(node, b)
        for t, b in enumerate(v.token_bytes):
            expected = bool(b) and regex.viable(node, b)
            assert (table[s, t] >= 0) == expected, (done, b)


def test_three_ways_to_a_mask_agree(v, full):
    walker = masks.Walker(full, v.token_bytes)
    table = walker.precompute()
    trie = masks.TokenTrie(v.token_bytes)
    assert lab.walk_check(full, table, v.token_bytes, range(0, full.n_states, 7)) == 0
    for s in range(0, full.n_states, 5):
        assert (walker.row(s) == table[s]).all()
        assert (trie.row(full, s, v.size)[0] == table[s]).all()


def test_tokens_that_span_grammar_boundaries(v, full):
    ids = {b: i for i, b in enumerate(v.token_bytes)}
    for token in (b'":"', b'","', b'{"'):
        assert token in ids and lab.spans_boundary(token)
    table = masks.Walker(full, v.token_bytes).precompute()
    after_key = full.walk(b'{"city')
    assert table[after_key, ids[b'":"']] == full.walk(b'":"', after_key) != DEAD  # closes the key, opens the value
    in_string = full.walk(b'{"city":"Lima')
    assert table[in_string, ids[b'","']] == full.walk(b'{"city":"Lima","') != DEAD  # ends the value, opens the next key
    closed = full.walk(b'{"city":"Lima"')
    assert table[closed, ids[b'","']] == DEAD  # a second quote cannot follow the closed string
    full_city = full.walk(b'{"city":"' + b"x" * 12)  # maxLength reached: only the closing quote may come
    allowed = {v.token_bytes[t] for t in np.nonzero(table[full_city] >= 0)[0]}
    assert allowed and all(b.startswith(b'"') for b in allowed)


def test_eos_only_where_the_output_is_complete(v, full):
    table = masks.Walker(full, v.token_bytes).precompute()
    for s in range(full.n_states):
        mask = masks.allowed(table[s].copy(), bool(full.accepting[s]), v.eos_id)
        assert mask[v.eos_id] == full.accepting[s]
        assert mask.any()  # a trimmed state always has a way on


def test_every_constrained_sample_conforms_and_free_ones_do_not(v, full):
    table = masks.Walker(full, v.token_bytes).precompute()
    lines = vocab.corpus(1500, seed=1, distinct_words=400)
    encoded = [[*v.encode(x), v.eos_id] for x in lines if x.startswith("{")]
    models = [sampling.RandomLogits(v.size), sampling.Bigram(v.size, encoded, v.eos_id)]
    rng = np.random.default_rng(0)
    for model in models:
        masked = [sampling.decode(model, full, table, v.eos_id, rng) for _ in range(40)]
        stats = lab.evaluate(masked, v, vocab.SCHEMA)
        assert stats["finished"] == stats["parsed"] == stats["conform"] == 40, model.name
    free = [sampling.decode(models[0], full, None, v.eos_id, rng) for _ in range(40)]
    assert lab.evaluate(free, v, vocab.SCHEMA)["conform"] == 0


def test_shape_is_not_truth(v, full):
    """The bigram model under the mask always conforms, yet names cities in the wrong country."""
    table = masks.Walker(full, v.token_bytes).precompute()
    lines = vocab.corpus(1500, seed=1, distinct_words=400)
    model = sampling.Bigram(v.size, [[*v.encode(x), v.eos_id] for x in lines if x.startswith("{")], v.eos_id)
    rng = np.random.default_rng(1)
    stats = lab.evaluate([sampling.decode(model, full, table, v.eos_id, rng) for _ in range(60)], v, vocab.SCHEMA)
    assert stats["conform"] == 60 and stats["true"] < 60


def test_quick_run_writes_its_rows(tmp_path, capsys):
    from labs.structured.__main__ import main

    assert main(["--quick", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "structured.json").read_text())
    row = doc["machines"]["CPU"]["rows"][0]
    assert row["ok"] and row["mask_mismatches"] == 0 and row["bigram_constrained_conform"] == row["samples"]


def test_report_renders_the_recorded_run():
    from labs.structured import report

    table = report.structured_table()
    assert table.count("\n") == 1 + len(report._rows()) and "16,384" in table
    assert report.bitmask_bytes("llama-3.1-8b") == 4008 * 4  # cdiv(128,256, 32) int32 words
    assert report.structured_row(16384)["ok"]
