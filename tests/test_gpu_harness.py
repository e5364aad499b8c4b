"""The Part 3 labs' shared harness: CUDA source checks, timing summaries, results files, page tables.

All CPU: nothing here needs torch, nvcc or a GPU, except the nvcc compile, which skips
where nvcc is not installed.
"""

from __future__ import annotations

import json
import shutil

import pytest

from labs import recorded
from labs.gpu_harness import cuda_build, results, timing
from labs.gpu_harness.report import Column, LabResults
from labs.gpu_harness.timing import Summary, gb_per_s, summarize

GOOD_CU = """
#include <cstdint>
// __global__ void commented_out_kernel(float* x) {}
template <int M>
__global__ void scale_kernel(float* x, int n) { if (threadIdx.x < n) x[threadIdx.x] *= M; }
__global__ void __launch_bounds__(128) zero_kernel(float* x) { x[threadIdx.x] = 0.f; }
int launch_scale(int64_t x, int n) { scale_kernel<2><<<1, 32>>>((float*)x, n); return 0; }
"""


def _src(tmp_path, text, decl="int launch_scale(int64_t x, int n);", kernels=("scale_kernel", "zero_kernel")):
    path = tmp_path / "k.cu"
    path.write_text(text)
    return cuda_build.CudaSource(path, decl, kernels)


def test_a_source_that_defines_what_it_declares_passes(tmp_path):
    src = _src(tmp_path, GOOD_CU)
    cuda_build.check_source(src)
    assert cuda_build.global_kernels(GOOD_CU) == ["scale_kernel", "zero_kernel"]
    assert src.functions == ["launch_scale"]


@pytest.mark.parametrize("text,decl,kernels,message", [
    (GOOD_CU, "int launch_scale(int64_t x, int n);", ("scale_kernel", "commented_out_kernel"), "commented_out_kernel"),
    (GOOD_CU, "int launch_missing(int64_t x);", ("scale_kernel",), r"launch_missing\(\) declared but not defined"),
    (GOOD_CU, "int launch_scale(int64_t x, float n);", ("scale_kernel",), "declared with"),
    (GOOD_CU + "\n}", "int launch_scale(int64_t x, int n);", ("scale_kernel",), "unbalanced"),
    ("#include <torch/extension.h>\n" + GOOD_CU, "int launch_scale(int64_t x, int n);", ("scale_kernel",), "torch headers"),
], ids=["kernel-only-in-a-comment", "launcher-missing", "argument-types-differ", "unbalanced", "torch-header"])
def test_a_source_that_breaks_its_declarations_is_refused(tmp_path, text, decl, kernels, message):
    with pytest.raises(cuda_build.SourceError, match=message):
        cuda_build.check_source(_src(tmp_path, text, decl, kernels))


def test_ptxas_register_counts_are_read_per_kernel():
    out = """ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90'
ptxas info    : Function properties for _Z3fooPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers
ptxas info    : Compiling entry function '_Z3barv' for 'sm_90'
ptxas info    : Used 8 registers, used 1 barriers, 4096 bytes smem"""
    assert cuda_build.ptxas_registers(out) == {"_Z3fooPf": 40, "_Z3barv": 8}


def test_summary_is_the_median_and_spread_of_the_samples():
    s = summarize([10.0, 12.0, 11.0, 30.0, 9.0])
    assert s == Summary(median_us=11.0, min_us=9.0, spread=pytest.approx((30 - 9) / 11), samples=5)
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([1.0, 0.0])
    assert gb_per_s(4e9, 1e6) == pytest.approx(4.0)  # 4 GB in 1 s
    assert gb_per_s(2**30, 268.4) == pytest.approx(4000.5, rel=1e-4)  # 1 GiB in 268.4 µs


def test_layer_count_rotates_enough_copies_to_keep_each_call_out_of_l2():
    l2 = 60 * 10**6
    assert timing.layer_count(268 * 10**6, l2) == timing.MIN_LAYERS  # (32, 4,096) in fp8: the floor
    # 8.4 MB (B = 1 in fp8): the other copies must hold 4 x 60 MB, so 29 of them, 30 in all.
    assert timing.layer_count(8_400_000, l2) == 30
    n = timing.layer_count(8_400_000, l2)
    assert (n - 1) * 8_400_000 >= timing.L2_MULTIPLE * l2 > (n - 2) * 8_400_000
    assert timing.layer_count(1000, l2) == timing.MAX_LAYERS
    with pytest.raises(ValueError, match="positive"):
        timing.layer_count(0, l2)


class _FakeCuda:
    """Enough of torch.cuda for layers_timer: a clock that each call advances, events that read
    it, and a graph that records the calls made while capturing and replays them."""

    def __init__(self):
        self.clock_ms, self.capturing, self.runs = 0.0, None, []
        cuda = self

        class Event:
            def __init__(self, enable_timing=False):
                self.at = None

            def record(self):
                self.at = cuda.clock_ms

            def elapsed_time(self, end):
                return end.at - self.at

        class CUDAGraph:
            def __init__(self):
                self.calls = []

            def replay(self):
                for call in self.calls:
                    call()

        class _Capture:
            def __init__(self, graph):
                self.graph = graph

            def __enter__(self):
                cuda.capturing = self.graph

            def __exit__(self, *exc):
                cuda.capturing = None

        self.Event, self.CUDAGraph, self.graph = Event, CUDAGraph, _Capture

    def synchronize(self):
        pass

    def call(self, name, ms):
        def run():
            if self.capturing is not None:
                self.capturing.calls.append(run)
            else:
                self.clock_ms += ms
                self.runs.append(name)
        return run


def test_layers_timer_captures_every_call_in_one_graph_and_reports_time_per_call():
    cuda = _FakeCuda()
    fake_torch = type("FakeTorch", (), {"cuda": cuda})
    calls = [cuda.call(f"layer{i}", 0.05 * (i + 1)) for i in range(4)]  # 0.05 + ... + 0.2 = 0.5 ms a replay
    us = timing.layers_timer(fake_torch, rep_ms=10, warmup_ms=1)(calls)
    assert us == pytest.approx(500 / 4)  # the median replay over the calls it holds, in µs
    assert cuda.runs[:4] == ["layer0", "layer1", "layer2", "layer3"]  # each ran once before the capture
    assert len(cuda.runs) % 4 == 0 and len(cuda.runs) >= 4 * (1 + 5 + 2 + 5)  # whole replays only
    with pytest.raises(ValueError, match="no calls"):
        timing.layers_timer(fake_torch)([])


ENV = {"gpu": "NVIDIA H200", "date": "2030-05-06", "sm_count": 132, "compute_capability": "9.0", "driver": "1",
       "cuda": "13.0", "torch": "2", "triton": "3"}


def _record(path, env=ENV, sections=None):
    sections = sections if sections is not None else {"s": [{"name": "a", "value": 1.5, "none": None}]}
    return results.record(path, "lab", env, {"copy_gb_s": 4000.0, "reps": 20}, sections,
                          lambda exp, r: r["name"], lambda secs: {k: str(len(v)) for k, v in secs.items()})


def test_recording_merges_rows_per_gpu_and_refuses_an_empty_section(tmp_path):
    path = tmp_path / "lab.json"
    _record(path)
    _record(path, {**ENV, "gpu": "NVIDIA A100-SXM4-80GB"})
    report = _record(path, {**ENV, "date": "2031-02-03"},
                     {"s": [{"name": "a", "value": 2.5, "none": None}, {"name": "b", "value": 1.0, "none": 1}]})
    assert report.replaced == ["s/a"] and report.added == ["s/b"]
    doc = recorded.load_results(path)
    assert sorted(doc.machines) == ["NVIDIA A100-SXM4-80GB", "NVIDIA H200"]
    e = results.entry(path, "H200")
    assert e["date"] == "2031-02-03" and e["sections"]["s"][0]["value"] == 2.5 and e["printed"] == {"s": "2"}
    assert results.entry(path, "A100")["sections"]["s"][0]["value"] == 1.5
    before = path.read_text()
    with pytest.raises(recorded.RecordedError, match="partial"):
        _record(path, sections={"s": []})
    assert path.read_text() == before and not list(tmp_path.glob("*.tmp"))
    with pytest.raises(results.ResultsError, match="name the GPU"):
        results.entry(path, "")
    assert results.entry(tmp_path / "absent.json", "H200") is None


def test_a_page_table_shows_the_recorded_values_gpu_and_date(tmp_path):
    path = tmp_path / "lab.json"
    lr = LabResults("lab", path, "python -m labs.lab --record",
                    {"s": [Column("Name", "name", "`{}`"), Column("Value", "value", "{:.2f}"), Column("None", "none")]})
    assert not lr.recorded("H200")
    assert "Not recorded yet" in lr.table("s", "H200") and "python -m labs.lab --record" in lr.table("s", "H200")
    _record(path)
    md = lr.table("s", "H200")
    assert "NVIDIA H200" in md and "2030-05-06" in md and "4,000 GB/s" in md
    assert "| `a` | 1.50 | — |" in md
    assert lr.row("s", "name", "a", "H200")["value"] == 1.5
    assert lr.recorded("h200") and not lr.recorded("A100")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_compiles_a_good_source_for_sm90(tmp_path):
    proc = cuda_build.nvcc_compile(_src(tmp_path, GOOD_CU), tmp_path)
    assert proc.returncode == 0, proc.stderr
    regs = cuda_build.ptxas_registers(proc.stdout + proc.stderr)
    assert any("scale_kernel" in k for k in regs) and any("zero_kernel" in k for k in regs)


def test_results_files_of_the_labs_parse(request):
    """Whatever is recorded under labs/results/ for these labs is readable by its page."""
    for lab in ("cuda_execution", "cuda_memory", "triton_tutorial"):
        doc = recorded.load_results(results.RESULTS_DIR / f"{lab}.json")
        if doc is not None:
            assert doc.lab == lab and doc.key == results.KEY
            for label, m in doc.machines.items():
                e = results.entry(doc.path, label)
                assert e["gpu"] == label and all(e["sections"].values()), json.dumps(e)[:200]


def test_recorded_printed_tables_are_the_recorded_rows_formatted():
    """The text a question shows as the command's output is the rows, formatted as the bench printed them."""
    import importlib

    for name in ("cuda_execution", "cuda_memory", "triton_tutorial"):
        doc = recorded.load_results(results.RESULTS_DIR / f"{name}.json")
        if doc is None:
            continue
        lab = importlib.import_module(f"labs.{name}.lab")
        for label in doc.machines:
            e = results.entry(doc.path, label)
            assert e["printed"] == lab.printed(e["sections"]), (name, label)


def test_finish_writes_out_and_records_with_a_copy_of_the_whole_file(tmp_path, monkeypatch, capsys):
    """What a GPU run sends back (--out) holds this run and, with --record, the merged results file."""
    import types

    from labs.gpu_harness import bench

    lab_module = types.SimpleNamespace(config_name=lambda exp, r: r["name"],
                                       printed=lambda secs: {k: f"{len(v)} rows" for k, v in secs.items()})
    results_path = tmp_path / "results" / "lab.json"
    _record(results_path, {**ENV, "gpu": "NVIDIA A100-SXM4-80GB"})  # another GPU already recorded
    out = tmp_path / "out"
    bench.finish("lab", ENV, {"copy_gb_s": 4000.0, "reps": 20}, {"s": [{"name": "a", "value": 1.5, "none": None}]},
                 lab_module, out, True, results_path)
    assert "recorded 1 row(s) for NVIDIA H200" in capsys.readouterr().out
    assert sorted(recorded.load_results(out / "lab.json").machines) == ["NVIDIA H200"]
    whole = recorded.load_results(out / "recorded_lab.json")
    assert sorted(whole.machines) == ["NVIDIA A100-SXM4-80GB", "NVIDIA H200"]
    assert whole.machines["NVIDIA H200"].derived == {"printed": {"s": "1 rows"}}
