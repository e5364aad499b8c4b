"""The bad CLI arguments a tester tried, one test each: exit 2 and one line saying what is allowed.

The rows are the tester's table, in its order. Each runs the CLI's main(argv)
in-process (tests/cli_helpers.py: CUDA hidden, a time limit, a memory cap), so a
GPU lab must refuse its bad arguments before it looks for a GPU. The last rows
are the values that are fine and must run (a tiny subnormal, an acceptance rate
of 1, a rate of inf); the subprocess rows check `python -m` itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import one_line, run_main
from conftest import ROOT

HUGE = "1" + "0" * 30
CONFIG = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
          "vocab_size": 128256, "intermediate_size": 14336, "max_position_embeddings": 131072,
          "torch_dtype": "bfloat16"}

# (id, cli, argv, exit code, a piece of the one stderr line). {tmp}: a fresh folder; {file}: a file in it;
# {nojson}: a file that is not JSON; {nokeys}: a config.json without num_hidden_layers; {full}: a non-empty folder.
ROWS = [
    ("kv unknown model", "labs.kv_sizing", ["--model", "gpt-17"], 2, "argument --model: unknown model 'gpt-17'"),
    ("kv unknown gpu", "labs.kv_sizing", ["--gpu", "rtx9999"], 2, "argument --gpu: unknown GPU 'rtx9999'"),
    ("kv max-model-len 0", "labs.kv_sizing", ["--max-model-len", "0"], 2, "argument --max-model-len: expected"),
    ("kv max-model-len -5", "labs.kv_sizing", ["--max-model-len=-5"], 2, "argument --max-model-len: expected"),
    ("kv max-model-len 10^30", "labs.kv_sizing", ["--max-model-len", HUGE], 2, "argument --max-model-len"),
    ("kv max-model-len abc", "labs.kv_sizing", ["--max-model-len", "abc"], 2, "argument --max-model-len"),
    ("kv max-model-len past the model", "labs.kv_sizing", ["--max-model-len", "131073"], 2,
     "llama-3.1-8b allows at most 131,072 tokens"),
    ("kv gpu-mem-util 0", "labs.kv_sizing", ["--gpu-memory-utilization", "0"], 2,
     "argument --gpu-memory-utilization: expected a finite number in (0, 1]"),
    ("kv gpu-mem-util -0.5", "labs.kv_sizing", ["--gpu-memory-utilization=-0.5"], 2, "(0, 1]"),
    ("kv gpu-mem-util 5", "labs.kv_sizing", ["--gpu-memory-utilization", "5"], 2, "(0, 1]"),
    ("kv gpu-mem-util nan", "labs.kv_sizing", ["--gpu-memory-utilization", "nan"], 2, "(0, 1]"),
    ("kv block-size 0", "labs.kv_sizing", ["--block-size", "0"], 2, "argument --block-size: expected a multiple of 16"),
    ("kv block-size -16", "labs.kv_sizing", ["--block-size=-16"], 2, "argument --block-size"),
    ("kv block-size 7", "labs.kv_sizing", ["--block-size", "7"], 2, "argument --block-size: expected a multiple of 16"),
    ("kv tp 0", "labs.kv_sizing", ["--tensor-parallel-size", "0"], 2, "argument --tensor-parallel-size"),
    ("kv tp -2", "labs.kv_sizing", ["--tensor-parallel-size=-2"], 2, "argument --tensor-parallel-size"),
    ("kv tp 3", "labs.kv_sizing", ["--tensor-parallel-size", "3"], 2, "not divisible by tensor parallel size 3"),
    ("kv max-num-seqs 0", "labs.kv_sizing", ["--max-num-seqs", "0"], 2, "argument --max-num-seqs"),
    ("kv max-num-batched-tokens -1", "labs.kv_sizing", ["--max-num-batched-tokens=-1"], 2,
     "argument --max-num-batched-tokens"),
    ("kv activation-gib -5", "labs.kv_sizing", ["--activation-gib=-5"], 2, "argument --activation-gib"),
    ("kv activation-gib nan", "labs.kv_sizing", ["--activation-gib", "nan"], 2, "argument --activation-gib"),
    ("kv cudagraph-gib inf", "labs.kv_sizing", ["--cudagraph-gib", "inf"], 2, "argument --cudagraph-gib"),
    ("kv config missing", "labs.kv_sizing", ["--config", "{tmp}/none.json"], 2, "none.json: no such file"),
    ("kv config not json", "labs.kv_sizing", ["--config", "{nojson}"], 2, "not valid JSON"),
    ("kv config missing keys", "labs.kv_sizing", ["--config", "{nokeys}"], 2, "missing field 'num_hidden_layers'"),
    ("kv config is a folder", "labs.kv_sizing", ["--config", "{tmp}"], 2, "is a folder, not a file"),
    ("kv kv dtype bogus", "labs.kv_sizing", ["--kv-cache-dtype", "int3"], 2, "argument --kv-cache-dtype: invalid choice"),
    ("kv model and config", "labs.kv_sizing", ["--model", "qwen3-8b", "--config", "{nokeys}"], 2,
     "not allowed with argument --model"),
    ("check missing --out", "labs.kv_sizing.check", [], 2, "the following arguments are required: --out"),
    ("check unwritable --out", "labs.kv_sizing.check", ["--out", "/proc/labs-probe"], 2, "argument --out"),
    ("sim no subcommand", "labs.serving_sim", [], 2, "the following arguments are required"),
    ("sim unknown subcommand", "labs.serving_sim", ["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    ("sim unknown model", "labs.serving_sim", ["batching", "--model", "gpt-17"], 2, "unknown model 'gpt-17'"),
    ("sim unknown gpu", "labs.serving_sim", ["batching", "--gpu", "rtx9999"], 2, "unknown GPU 'rtx9999'"),
    ("sim MoE model", "labs.serving_sim", ["batching", "--model", "mixtral-8x7b"], 2, "dense full-attention"),
    ("sim kv dtype bogus", "labs.serving_sim", ["batching", "--kv-cache-dtype", "int3"], 2, "unsupported kv cache dtype"),
    ("sim requests 0", "labs.serving_sim", ["batching", "--requests", "0"], 2, "argument --requests"),
    ("sim requests -3", "labs.serving_sim", ["batching", "--requests=-3"], 2, "argument --requests"),
    ("sim requests 10^9", "labs.serving_sim", ["batching", "--requests", "1000000000"], 2, "argument --requests"),
    ("sim requests many", "labs.serving_sim", ["batching", "--requests", "many"], 2, "argument --requests"),
    ("sim prompt-len abc", "labs.serving_sim", ["batching", "--prompt-len", "abc"], 2, "length range"),
    ("sim prompt-len 0", "labs.serving_sim", ["batching", "--prompt-len", "0"], 2, "length range"),
    ("sim prompt-len inverted", "labs.serving_sim", ["batching", "--prompt-len", "2048:128"], 2, "lo <= hi"),
    ("sim prompt-len -5:10", "labs.serving_sim", ["batching", "--prompt-len", "-5:10"], 2, "argument --prompt-len"),
    ("sim output-len 0", "labs.serving_sim", ["batching", "--output-len", "0"], 2, "length range"),
    ("sim prompt past max-model-len", "labs.serving_sim",
     ["batching", "--prompt-len", "9000", "--max-model-len", "4096"], 2, "above max_model_len 4096"),
    ("sim max-model-len past the model", "labs.serving_sim", ["batching", "--max-model-len", "200000"], 2,
     "argument --max-model-len: llama-3.1-8b allows at most 131,072 tokens"),
    ("sim max-model-len 10^30", "labs.serving_sim", ["batching", "--max-model-len", HUGE], 2, "argument --max-model-len"),
    ("sim gpu-mem-util 0", "labs.serving_sim", ["batching", "--gpu-memory-utilization", "0"], 2,
     "argument --gpu-memory-utilization"),
    ("sim gpu-mem-util nan", "labs.serving_sim", ["batching", "--gpu-memory-utilization", "nan"], 2,
     "argument --gpu-memory-utilization"),
    ("sim step-overhead -1", "labs.serving_sim", ["batching", "--step-overhead-ms=-1"], 2, "argument --step-overhead-ms"),
    ("sim step-overhead nan", "labs.serving_sim", ["batching", "--step-overhead-ms", "nan"], 2,
     "argument --step-overhead-ms"),
    ("sim step-overhead inf", "labs.serving_sim", ["batching", "--step-overhead-ms", "inf"], 2,
     "argument --step-overhead-ms"),
    ("sim seed -1", "labs.serving_sim", ["batching", "--seed=-1"], 2, "argument --seed"),
    ("sim seed 2^70", "labs.serving_sim", ["batching", "--seed", str(2**70)], 2, "argument --seed"),
    ("sim blocks override 1", "labs.serving_sim", ["batching", "--num-gpu-blocks-override", "1"], 2,
     "does not fit the KV pool"),
    ("sim max-num-batched-tokens 1", "labs.serving_sim", ["batching", "--max-num-batched-tokens", "1"], 2,
     "argument --max-num-batched-tokens: must be >= max_num_seqs (64)"),
    ("sim knobs rate 0", "labs.serving_sim", ["knobs", "--rate", "0"], 2, "argument --rate"),
    ("sim knobs rate -5", "labs.serving_sim", ["knobs", "--rate=-5"], 2, "argument --rate"),
    ("sim knobs rate nan", "labs.serving_sim", ["knobs", "--rate", "nan"], 2, "argument --rate"),
    ("sim knobs seqs 0", "labs.serving_sim", ["knobs", "--seqs", "0,8"], 2, "argument --seqs"),
    ("sim knobs seqs empty", "labs.serving_sim", ["knobs", "--seqs", ","], 2, "argument --seqs"),
    ("sim chunked arrival 0", "labs.serving_sim", ["chunked-prefill", "--arrival", "0"], 2, "argument --arrival"),
    ("sim chunked arrival nan", "labs.serving_sim", ["chunked-prefill", "--arrival", "nan"], 2, "argument --arrival"),
    ("sim chunked arrival inf", "labs.serving_sim", ["chunked-prefill", "--arrival", "inf"], 2, "argument --arrival"),
    ("sim chunked budgets abc", "labs.serving_sim", ["chunked-prefill", "--budgets", "512,abc"], 2,
     "argument --budgets"),
    ("sim chunked long prompt past max", "labs.serving_sim", ["chunked-prefill", "--long-prompt-len", "200000"], 2,
     "does not fit max_model_len 131072"),
    ("sim preemption cases bad", "labs.serving_sim", ["preemption", "--cases", "2048by64"], 2, "argument --cases"),
    ("sim preemption cases 0x0", "labs.serving_sim", ["preemption", "--cases", "0x0"], 2, "argument --cases"),
    ("sim spec alpha 1.5", "labs.serving_sim", ["spec-decode", "--alpha", "1.5"], 2, "argument --alpha"),
    ("sim spec alphas nan", "labs.serving_sim", ["spec-decode", "--alphas", "0.5,nan"], 2, "argument --alphas"),
    ("sim spec draft bogus", "labs.serving_sim", ["spec-decode", "--draft", "gpt-17"], 2, "unknown model 'gpt-17'"),
    ("sim spec ks 0", "labs.serving_sim", ["spec-decode", "--ks", "0"], 2, "argument --ks"),
    ("sim spec ks huge", "labs.serving_sim", ["spec-decode", "--ks", "100000"], 2, "argument --ks"),
    ("sim spec trials huge", "labs.serving_sim", ["spec-decode", "--trials", HUGE], 2, "argument --trials"),
    ("sim sampling batches abc", "labs.serving_sim", ["sampling", "--batches", "x"], 2, "argument --batches"),
    ("sim defaults gpus bogus", "labs.serving_sim", ["defaults", "--gpus", "rtx9999"], 2, "unknown GPU 'rtx9999'"),
    ("sim defaults gpus empty", "labs.serving_sim", ["defaults", "--gpus", ","], 2, "unknown GPU ''"),
    ("sim --out unwritable", "labs.serving_sim", ["defaults", "--out", "/sys/relprobe"], 2, "argument --out"),
    ("sim --out is a file", "labs.serving_sim", ["defaults", "--out", "{file}"], 2, "is a file, not a folder"),
    ("oom no args", "labs.oom", [], 2, "argument --scenario: is required"),
    ("oom bogus scenario", "labs.oom", ["--scenario", "bogus"], 2, "argument --scenario: invalid choice"),
    ("oom unwritable --out", "labs.oom", ["--scenario", "all", "--out", "/proc/labs-probe"], 2, "argument --out"),
    ("oom --out is a file", "labs.oom", ["--scenario", "all", "--out", "{file}"], 2, "is a file, not a folder"),
    ("bench no GPU", "labs.paged_attention.bench", [], 2, "no CUDA GPU visible"),
    ("bench shape bogus", "labs.paged_attention.bench", ["--shape", "b9-l9k"], 2, "argument --shape: invalid choice"),
    ("bench tile-n 17", "labs.paged_attention.bench", ["--tile-n", "17"], 2, "argument --tile-n: expected a power of 2"),
    ("bench tile-n 0", "labs.paged_attention.bench", ["--tile-n", "0"], 2, "argument --tile-n"),
    ("bench num-warps -1", "labs.paged_attention.bench", ["--num-warps=-1"], 2, "argument --num-warps"),
    ("bench num-warps 3", "labs.paged_attention.bench", ["--num-warps", "3"], 2, "argument --num-warps: expected a power"),
    ("bench rep-ms abc", "labs.paged_attention.bench", ["--rep-ms", "abc"], 2, "argument --rep-ms"),
    ("bench record and sweep", "labs.paged_attention.bench", ["--record", "--sweep"], 2, "run it without --sweep"),
    ("bench timer bogus", "labs.paged_attention.bench", ["--timer", "wall"], 2, "argument --timer: invalid choice"),
    ("bench record under the layer timer", "labs.paged_attention.bench", ["--record", "--timer", "layers"], 2,
     "drop --timer layers"),
    ("bench --out is a file", "labs.paged_attention.bench", ["--out", "{file}"], 2, "argument --out"),
    ("bench fold 1", "labs.paged_attention.bench", ["--fold", "1"], 2, "argument --fold: a group of one piece"),
    ("bench fold 2000", "labs.paged_attention.bench", ["--fold", "2000"], 2, "argument --fold: expected a whole number"),
    ("bench record with a fold", "labs.paged_attention.bench", ["--record", "--fold", "32"], 2, "drop --fold"),
    ("run_all no --out", "labs.run_all", [], 2, "--out DIR is required"),
    ("run_all --out is a file", "labs.run_all", ["--out", "{file}"], 2, "is a file, not a folder"),
    ("run_all --out not empty", "labs.run_all", ["--out", "{full}"], 2, "pass --overwrite"),
    ("run_all --out unwritable", "labs.run_all", ["--out", "/proc/labs-probe"], 2, "argument --out"),
    ("run_all timeout 0", "labs.run_all", ["--out", "{tmp}/r", "--timeout", "0"], 2, "argument --timeout"),
    ("run_all timeout nan", "labs.run_all", ["--out", "{tmp}/r", "--timeout", "nan"], 2, "argument --timeout"),
    ("run_all timeout inf", "labs.run_all", ["--out", "{tmp}/r", "--timeout", "inf"], 2, "argument --timeout"),
    ("run_all timeout abc", "labs.run_all", ["--out", "{tmp}/r", "--timeout", "abc"], 2, "argument --timeout"),
    ("run_all only bogus", "labs.run_all", ["--out", "{tmp}/r", "--only", "bogus"], 2, "argument --only: invalid choice"),
    ("run_all list with bogus only", "labs.run_all", ["--list", "--only", "bogus"], 2, "argument --only"),
    ("formats non-numeric", "labs.number_formats", ["--values", "abc"], 2, "argument --values: expected a finite"),
    ("formats no values", "labs.number_formats", ["--values"], 2, "argument --values: expected at least one"),
    ("formats nan inf", "labs.number_formats", ["--values", "nan", "-inf"], 2, "argument --values: expected a finite"),
    ("formats 1e400", "labs.number_formats", ["--values", "1e400"], 2, "argument --values: expected a finite"),
    ("formats all zero", "labs.number_formats", ["--values", "0", "0"], 2, "argument --values: not all zero"),
    # Values that are fine: they must run.
    ("formats negative", "labs.number_formats", ["--values", "-1e-9", "2"], 0, ""),
    ("formats tiny subnormal", "labs.number_formats", ["--values", "1e-320", "1"], 0, ""),
    ("sim spec alpha 1.0", "labs.serving_sim", ["spec-decode", "--alpha", "1.0", "--trials", "2000"], 0, ""),
    ("sim knobs rate inf", "labs.serving_sim",
     ["knobs", "--rate", "inf", "--requests", "40", "--seqs", "8,16"], 0, ""),
]


def _fill(argv: list[str], tmp: Path) -> list[str]:
    (tmp / "a-file").write_text("x")
    (tmp / "not.json").write_text("{oops")
    (tmp / "nokeys.json").write_text(json.dumps({k: v for k, v in CONFIG.items() if k != "num_hidden_layers"}))
    (tmp / "full").mkdir(exist_ok=True)
    (tmp / "full" / "old.log").write_text("x")
    subs = {"{tmp}": str(tmp), "{file}": str(tmp / "a-file"), "{nojson}": str(tmp / "not.json"),
            "{nokeys}": str(tmp / "nokeys.json"), "{full}": str(tmp / "full")}
    out = []
    for arg in argv:
        for key, value in subs.items():
            arg = arg.replace(key, value)
        out.append(arg)
    return out


@pytest.mark.parametrize("cli, argv, rc, needle", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_cli_argument(cli, argv, rc, needle, tmp_path):
    code, _, err = run_main(cli, _fill(argv, tmp_path))
    lines = one_line(err)
    assert "Traceback" not in err
    assert code == rc, f"exit {code}, stderr: {err!r}"
    if rc == 2:
        assert len(lines) == 1, f"expected one line on stderr, got {lines}"
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("args", [("labs.number_formats",), ("labs.kv_sizing", "--block-size", "0")])
def test_as_a_module(args):
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert "Traceback" not in proc.stderr
    assert proc.returncode == (0 if len(args) == 1 else 2), proc.stderr
