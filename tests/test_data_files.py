"""Every data file is read strictly: a typo, a duplicate key or a YAML mistake fails at its line.

labs/data/models.yaml and gpus.yaml (labs/specs.py), labs/data/vllm.yaml
(labs/vllm_facts.py), docs/.data/modules.yaml and glossary.yaml
(docs/.hooks/site_data.py), all parsed by labs/datafile.py. Each case edits a
copy of the real file once and checks the one-line error: file, line, field.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import ROOT

pytest.importorskip("pydantic")  # site_data is the site build's side; the GPU box has no pydantic
from labs import datafile, specs, vllm_facts

sys.path.insert(0, str(ROOT / "docs" / ".hooks"))
import site_data  # noqa: E402

MODELS = (ROOT / "labs/data/models.yaml").read_text(encoding="utf-8")
GPUS = (ROOT / "labs/data/gpus.yaml").read_text(encoding="utf-8")
FACTS = (ROOT / "labs/data/vllm.yaml").read_text(encoding="utf-8")
MODULES = (ROOT / site_data.MODULES_FILE).read_text(encoding="utf-8")
GLOSSARY = (ROOT / site_data.GLOSSARY_FILE).read_text(encoding="utf-8")


def _line(text: str, needle: str) -> int:
    return text[: text.index(needle)].count("\n") + 1


def _edit(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# ---------------------------------------------------------------------------
# The reader
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("text, line, field, message", [
    ("a: 1\nb:\n  c: 2\n  c: 3\n", 4, "b.c", "duplicate key (first given on line 3)"),
    ("a: 1\na: 1\n", 2, "a", "duplicate key"),
    ("x: [1, {y: 1, y: 2}]\n", 1, None, "duplicate key"),
    ("when: 2026-13-45\n", 1, "when", "'2026-13-45' is not a real date (month must be in 1..12)"),
    ("a:\n\tb: 1\n", 2, None, "YAML syntax error: a tab character; indent with spaces"),
    ("a: 1\n---\nb: 2\n", 2, None, "YAML syntax error: but found another document"),
    ("a: !!python/object/apply:os.system [ls]\n", 1, None, "could not determine a constructor"),
    ("? [1, 2]\n: 3\n", 1, None, "a mapping key must be a plain value"),
    ("a: [1, 2\n", 2, None, "YAML syntax error"),
])
def test_reader_errors_name_the_line(text, line, field, message):
    with pytest.raises(datafile.DataError) as exc:
        datafile.loads(text, "f.yaml")
    err = exc.value
    assert (err.file, err.line) == ("f.yaml", line)
    if field:
        assert err.field == field
    assert message in err.message
    assert str(err).startswith(f"f.yaml:{line}: ")


def test_reader_keeps_merges_and_lines():
    doc = datafile.loads("base: &b {x: 1}\nd:\n  <<: *b\n  x: 2\nl:\n  - 1\n  - 2\n", "f.yaml")
    assert doc.data == {"base": {"x": 1}, "d": {"x": 2}, "l": [1, 2]}
    assert doc.line(("d", "x")) == 4 and doc.line(("l", 1)) == 7 and doc.line(("l", 9)) == 5


def test_reader_refuses_an_alias_bomb_quickly():
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for prev, name in zip("abcdef", "bcdefg"):
        bomb += f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]\n"
    with pytest.raises(datafile.DataError, match="are aliases expanding"):
        datafile.loads(bomb, "bomb.yaml")


def test_reader_names_bytes_that_are_not_utf8(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_bytes(b"a: 1\nb: caf\xe9\n")
    with pytest.raises(datafile.DataError, match=r"x.yaml:2: not UTF-8: byte 0xe9"):
        datafile.load(path, "x.yaml")
    with pytest.raises(datafile.DataError, match="is a folder"):
        datafile.load(tmp_path, "dir")


# ---------------------------------------------------------------------------
# labs/data/models.yaml and gpus.yaml
# ---------------------------------------------------------------------------

LLAMA_TIE = "    tie_word_embeddings: false\n"


@pytest.mark.parametrize("old, new, field, message", [
    (LLAMA_TIE, LLAMA_TIE.replace("tie_word_embeddings", "tie_word_embedings"),
     "models.llama-3.1-8b.tie_word_embedings", "unknown field; did you mean 'tie_word_embeddings'?"),
    ("    n_layers: 32\n", "    n_layers: 32\n    n_layers: 33\n", "models.llama-3.1-8b.n_layers", "duplicate key"),
    ("    n_layers: 32\n", "    n_layers: '32'\n", "models.llama-3.1-8b.n_layers", "expected an integer, got '32'"),
    ("    tie_word_embeddings: false\n", "    tie_word_embeddings: 'no'\n",
     "models.llama-3.1-8b.tie_word_embeddings", "expected true or false"),
    ("    n_kv_heads: 8\n", "    n_kv_heads: 7\n", "models.llama-3.1-8b", "must be a multiple of n_kv_heads"),
    ("    n_layers: 32\n", "", "models.llama-3.1-8b", "missing field 'n_layers'"),
    ("      kv_lora_rank: 512\n", "      kv_lora_rank: 512\n      kv_lora_rnk: 1\n",
     "models.deepseek-v3.mla.kv_lora_rnk", "unknown field"),
])
def test_models_yaml_mistakes(tmp_path, old, new, field, message):
    path = tmp_path / "models.yaml"
    path.write_text(_edit(MODELS, old, new), encoding="utf-8")
    with pytest.raises(specs.SpecError) as exc:
        specs._load_models(str(path))
    text = str(exc.value)
    assert text.startswith(f"{path}:") and f"field '{field}'" in text and message in text, text


def test_models_yaml_typo_line_is_the_typo(tmp_path):
    edited = _edit(MODELS, LLAMA_TIE, LLAMA_TIE.replace("tie_word_embeddings", "tie_word_embedings"))
    path = tmp_path / "models.yaml"
    path.write_text(edited, encoding="utf-8")
    with pytest.raises(specs.SpecError, match=rf"models.yaml:{_line(edited, 'tie_word_embedings')}: "):
        specs._load_models(str(path))


@pytest.mark.parametrize("old, new, message", [
    ("    sm_count: 132\n", "    sm_count: 132\n    sm_cont: 1\n", "unknown field; did you mean 'sm_count'?"),
    ("    sm_count: 132\n", "    sm_count: 132.5\n", "expected an integer"),
    (None, "extra: 1\n", "expected one top-level key 'gpus', found ['extra', 'gpus']"),
    ("      bf16: 312\n", "      bf16: .nan\n", "expected a finite number"),
])
def test_gpus_yaml_mistakes(tmp_path, old, new, message):
    path = tmp_path / "gpus.yaml"
    path.write_text(GPUS + new if old is None else _edit(GPUS, old, new), encoding="utf-8")
    with pytest.raises(specs.SpecError, match="gpus.yaml:") as exc:
        specs._load_gpus(str(path))
    assert message in str(exc.value)


def test_the_real_spec_files_load():
    assert "llama-3.1-8b" in specs.all_models() and "h200" in specs.all_gpus()
    assert specs.get_model("llama-3.1-8b").tie_word_embeddings is False


# ---------------------------------------------------------------------------
# labs/data/vllm.yaml
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("old, new, field, message", [
    ("version: 0.33.0\n", "version: 0.33\n", "version", "expected text"),
    ("    flag: --gpu-memory-utilization\n", "    flag: --gpu-memory-utilization\n    falg: x\n",
     "engine_args.gpu_memory_utilization.falg", "unknown field; did you mean 'flag'?"),
    ("    flag: --gpu-memory-utilization\n", "    flag: --gpu-memory-utilization\n    default: 0.9\n",
     "engine_args.gpu_memory_utilization.default", "duplicate key"),
    ("    flag: --gpu-memory-utilization\n", "    flag: gpu-memory-utilization\n",
     "engine_args.gpu_memory_utilization", "flag must start with '--'"),
    ("version: 0.33.0\n", "", None, "missing field 'version'"),
])
def test_vllm_yaml_mistakes(tmp_path, old, new, field, message):
    path = tmp_path / "vllm.yaml"
    path.write_text(_edit(FACTS, old, new), encoding="utf-8")
    with pytest.raises(vllm_facts.FactError) as exc:
        vllm_facts.load(path)
    text = str(exc.value)
    assert text.startswith(f"{path}:") and message in text, text
    if field:
        assert f"field '{field}'" in text, text


def test_a_metric_type_outside_the_three_kinds_is_refused(tmp_path):
    edited = FACTS.replace("    type: gauge\n", "    type: gague\n", 1)
    path = tmp_path / "vllm.yaml"
    path.write_text(edited, encoding="utf-8")
    with pytest.raises(vllm_facts.FactError, match=rf"vllm.yaml:{_line(edited, 'gague')}: field 'metrics\..*\.type'"):
        vllm_facts.load(path)


# ---------------------------------------------------------------------------
# docs/.data/modules.yaml and glossary.yaml (pydantic, site build only)
# ---------------------------------------------------------------------------


def _site_root(tmp_path: Path, modules: str = MODULES, glossary: str = GLOSSARY) -> Path:
    (tmp_path / "docs/.data").mkdir(parents=True)
    (tmp_path / site_data.MODULES_FILE).write_text(modules, encoding="utf-8")
    (tmp_path / site_data.GLOSSARY_FILE).write_text(glossary, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("old, new, field, message", [
    ("    bank: false\n", "    bank: nope\n", "modules[1].bank", "valid boolean"),
    ("    bank: false\n", "    bnak: false\n", "modules[1].bnak", "unknown field"),
    ("  - part: 1\n", "  - part: one\n", "modules[1].part", "valid integer"),
    ("    name: Foundations\n", "    name: Foundations\n    name: Basics\n", "modules[0].name", "duplicate key"),
    ("  - part: 1\n", "  - part: 2\n", "modules", "parts must be 0, 1, 2"),
])
def test_modules_yaml_mistakes(tmp_path, old, new, field, message):
    edited = _edit(MODULES, old, new)
    root = _site_root(tmp_path, modules=edited)
    with pytest.raises(datafile.DataError) as exc:
        site_data.load_modules(root)
    err = exc.value
    assert err.file == site_data.MODULES_FILE and err.field == field and message in err.message, str(err)
    assert err.line is not None and err.line > 1


@pytest.mark.parametrize("old, new, field, message", [
    ("  - term: TTFT\n", "  - term: TTFT\n    term: TPOT\n", "terms[0].term", "duplicate key"),
    ("    expansion: Time to first token\n", "    expansion: [Time]\n", "terms[0].expansion", "valid string"),
    ("    expansion: Time to first token\n", "    expanson: Time to first token\n", "terms[0].expanson",
     "unknown field"),
    ("  - term: TPOT\n", "  - term: TTFT\n", "terms", "defined twice"),
])
def test_glossary_yaml_mistakes(tmp_path, old, new, field, message):
    root = _site_root(tmp_path, glossary=_edit(GLOSSARY, old, new))
    with pytest.raises(datafile.DataError) as exc:
        site_data.load_glossary(root)
    err = exc.value
    assert err.file == site_data.GLOSSARY_FILE and err.field == field and message in err.message, str(err)


def test_the_real_site_data_loads():
    assert site_data.load_modules(ROOT).modules[0].name
    assert any(t.term == "TTFT" for t in site_data.load_glossary(ROOT).terms)


def test_labs_never_import_pydantic():
    import re

    imports = re.compile(r"^\s*(import|from)\s+pydantic\b", re.M)
    for path in (ROOT / "labs").rglob("*.py"):
        assert not imports.search(path.read_text(encoding="utf-8")), path


def test_an_sm_clock_in_hz_instead_of_mhz_is_refused():
    """gpus.yaml's sm_clock_mhz feeds the shared-memory bandwidth a lesson quotes: 1.98e9 (Hz)
    would make it a million times too fast, so the unit is checked."""
    import dataclasses

    h200 = specs.get_gpu("h200")
    assert h200.sm_clock_mhz == 1980 and h200.provenance["sm_clock_mhz"] == "measured"
    with pytest.raises(specs.SpecError, match="sm_clock_mhz must be in MHz"):
        dataclasses.replace(h200, sm_clock_mhz=1.98e9)
