"""The OOM lab: diagnosis from recorded numbers (CPU), and each scenario on a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from labs.oom.diagnose import GIB, Evidence, diagnose

MIB = 2**20
H200_TOTAL = 143771 * MIB
RESULTS = Path(__file__).resolve().parent.parent / "labs" / "results" / "oom.json"

# Numbers of the shape each scenario records on an H200 (labs/results/oom.json holds the measured ones).
CASES = {
    "kv-too-small": Evidence(
        total=H200_TOTAL, free=124 * GIB, reserved=15 * GIB, allocated=15 * GIB, largest_free_block=0,
        requested=16 * GIB,
        context={"kv_needed": 16 * GIB, "kv_available": 10 * GIB, "max_model_len": 131072,
                 "estimated_max_model_len": 81920}),
    "prefill-activation": Evidence(
        total=H200_TOTAL, free=300 * MIB, reserved=138 * GIB, allocated=138 * GIB, largest_free_block=20 * MIB,
        requested=1792 * MIB,
        context={"batched_tokens": 32768, "activation_bytes_per_token": 131 * 1024, "headroom": int(2.4 * GIB)}),
    "two-instances": Evidence(
        total=H200_TOTAL, free=55 * GIB, reserved=0, allocated=0, largest_free_block=0, requested=70 * GIB,
        context={"instance_fractions": [0.6, 0.5]}),
    "fragmentation": Evidence(
        total=H200_TOTAL, free=64 * MIB, reserved=9 * GIB, allocated=5 * GIB, largest_free_block=512 * MIB,
        requested=768 * MIB),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_diagnosis_names_the_cause(kind):
    d = diagnose(CASES[kind])
    assert d.kind == kind
    assert d.cause and d.knob


def test_knobs_name_the_real_flags():
    knob = diagnose(CASES["kv-too-small"]).knob
    assert "--max-model-len" in knob and "81920" in knob
    assert "--max-num-batched-tokens" in diagnose(CASES["prefill-activation"]).knob
    assert "--gpu-memory-utilization" in diagnose(CASES["two-instances"]).knob
    assert "expandable_segments:True" in diagnose(CASES["fragmentation"]).knob


def test_prefill_tokens_that_fit():
    d = diagnose(CASES["prefill-activation"])
    assert d.numbers["tokens_that_fit"] == int(2.4 * GIB) // (131 * 1024)


def test_fractions_within_one_are_not_two_instances():
    ev = Evidence(total=H200_TOTAL, free=10 * GIB, reserved=0, allocated=0, largest_free_block=0,
                  requested=20 * GIB, context={"instance_fractions": [0.5, 0.45]})
    assert diagnose(ev).kind == "capacity"


def test_cached_memory_in_one_block_is_not_fragmentation():
    # The request fits in the cache's largest block: the allocator would serve it.
    ev = Evidence(total=H200_TOTAL, free=0, reserved=4 * GIB, allocated=2 * GIB, largest_free_block=2 * GIB,
                  requested=1 * GIB)
    assert diagnose(ev).kind != "fragmentation"


def test_no_memory_at_all_is_capacity():
    ev = Evidence(total=H200_TOTAL, free=1 * GIB, reserved=130 * GIB, allocated=130 * GIB,
                  largest_free_block=0, requested=8 * GIB)
    assert diagnose(ev).kind == "capacity"


@pytest.mark.skipif(not RESULTS.exists(), reason="labs/results/oom.json not recorded yet")
def test_recorded_results_diagnose_the_same_on_cpu():
    """The recorded GPU evidence, re-diagnosed here, gives the recorded cause."""
    from labs import recorded

    rows = recorded.load_results(RESULTS).machine("H200").rows
    assert {r["scenario"] for r in rows} == set(CASES)
    for report in rows:
        name = report["scenario"]
        ev = Evidence(**report["evidence"])
        assert diagnose(ev).kind == report["diagnosis"]["kind"] == name
        assert report["as_predicted"], name


def test_cli_without_cuda_exits_2(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from labs.oom.__main__ import main

    assert main(["--scenario", "kv-too-small"]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "Traceback" not in err


def test_cli_help():
    from labs.oom.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0


# ---------------------------------------------------------------------------
# GPU: each scenario fails as predicted, the fix passes, memory returns
# ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_scenario_on_gpu(name, tmp_path):
    pytest.importorskip("torch")
    from labs.oom import scenarios

    snapshot = str(tmp_path / f"{name}.pickle") if name == "kv-too-small" else None
    report = scenarios.RUNNERS[name](snapshot)
    assert report["failure"]["failed"], report["failure"]
    assert report["diagnosis"]["kind"] == name, report["diagnosis"]
    assert report["fix"]["passed"], report["fix"]
    assert report["memory"]["back_to_baseline"], report["memory"]
    if snapshot:
        assert Path(snapshot).stat().st_size > 0
