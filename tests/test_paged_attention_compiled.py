"""The compiled decode kernel, read without a GPU: the fp8 V tile is never read a byte at a time.

Why a test: the fp8 kernel's speed rests on one compiler decision (NOTES.md, v5). Written
as a plain cast, Triton moves the e4m3 -> fp16 conversion into the matrix unit's operand
layout and reads V from shared memory one byte per load; `_e4m3_to_f16` keeps it where the
tile was loaded. A change to the kernel, or a Triton that looks through the inline PTX,
would bring the byte loads back with every numerical test still green.

The kernels compile for sm_90 in a child process, because this one runs Triton's
interpreter (conftest) and the interpreter's kernels cannot be compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.filterwarnings("ignore")


def _compile_counts(*args: str) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-m", "labs.paged_attention.compiled", "--json", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"compiling for sm_90 failed:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("split", [False, True], ids=["one-split", "split-k"])
def test_fp8_kernel_converts_v_without_byte_loads(split):
    counts = _compile_counts("--dtype", "fp8", *(["--split"] if split else []))
    assert counts["ld.shared.b8"] == 0, f"the fp8 tile is read a byte at a time again: {counts}"
    assert counts["cvt.rn.f16x2.e4m3x2"] > 0, f"no e4m3 conversion in the fp8 kernel: {counts}"
    assert counts["mma.sync"] > 0 and counts["cp.async.cg.shared"] > 0, f"no matrix unit or no pipeline: {counts}"


def test_bf16_kernel_has_no_fp8_conversion():
    counts = _compile_counts("--dtype", "bf16")
    assert counts["cvt.rn.f16x2.e4m3x2"] == 0 and counts["ld.shared.b8"] == 0
    assert counts["ldmatrix"] > 0, counts


def test_cli_refuses_to_compile_under_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "labs.paged_attention.compiled"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "unset TRITON_INTERPRET" in done.stderr


def test_the_reduction_compiles_in_every_plan_the_launcher_asks_for():
    """The flat plan with and without the fold, and the chunked plan. Under the interpreter the
    reduction runs as Python, where an expression Triton cannot compile still runs."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    code = ("from labs.paged_attention import compiled, kernel\n"
            "for flat, fold in ((True, 0), (True, kernel.REDUCE_CHUNK_CUDA_FP8), (True, 3), (False, 0)):\n"
            "    ptx = compiled.reduction_ptx(flat=flat, fold=fold)\n"
            "    assert '.entry split_reduce_kernel' in ptx and 'st.global' in ptx, (flat, fold)\n"
            "print('compiled')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "compiled", done.stderr[-3000:]
