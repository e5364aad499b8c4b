"""The one writer and reader of recorded lab results (labs/recorded.py), and each way a `--record` used to lose data.

Every case here once happened with a lab writing its own JSON: a one-scenario OOM
run on another GPU replaced the H200 file, a failing KV check replaced three
passing configurations with one failing one, `bench --shape b1-l4k --record`
left one row of six, a second GPU broke the build, and a truncated file failed
it with a bare JSONDecodeError. Each test runs the lab's own record step on a
copy of the real recorded file and checks that the old rows are still there.
CPU only: the record steps take the documents the GPU runs produce.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from labs import recorded
from labs.kv_sizing import report as kv_report
from labs.oom import __main__ as oom_cli
from labs.oom import report as oom_report
from labs.paged_attention import bench
from labs.paged_attention import report as pa_report
from labs.recorded import Machine, RecordedError, load_results, record_rows

RESULTS = recorded.RESULTS_DIR
RUN = {"date": "2030-01-01", "driver": "999.9"}


def _copy(tmp_path: Path, name: str) -> Path:
    dest = tmp_path / name
    shutil.copyfile(RESULTS / name, dest)
    return dest


def _rows_by_key(path: Path, gpu: str, field: str) -> dict:
    return {r[field]: r for r in load_results(path).machine(gpu).rows}


# ---------------------------------------------------------------------------
# The loss cases, through each lab's record step
# ---------------------------------------------------------------------------


def _oom_doc(gpu: str, scenarios: dict) -> dict:
    """A one-run document as `python -m labs.oom --out` writes it."""
    return {"lab": "oom", "date": "2030-01-01", "gpu": gpu, "total_memory_bytes": 85_000_000_000,
            "versions": {"torch": "9.9", "cuda": "99.0", "python": "3.12"}, "scenarios": scenarios}


def _strip(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("ok", "run")}


def test_a_one_scenario_oom_run_on_another_gpu_keeps_the_h200_results(tmp_path):
    path = _copy(tmp_path, "oom.json")
    before = load_results(path).machine("H200")
    one = _strip(before.row(scenario="fragmentation"))
    report = oom_cli.record(_oom_doc("NVIDIA A100-SXM4-80GB", {"fragmentation": one}), path)
    after = load_results(path)
    assert sorted(after.machines) == ["NVIDIA A100-SXM4-80GB", "NVIDIA H200"]
    assert after.machine("H200").rows == before.rows  # untouched, still labelled H200
    assert [r["scenario"] for r in after.machine("A100").rows] == ["fragmentation"]
    assert report.added == ["fragmentation"] and "NVIDIA A100-SXM4-80GB" in str(report)
    # The pages still render the H200 and name it.
    assert "NVIDIA H200" in oom_report.oom_summary_table(gpu="H200", path=str(path))
    assert "NVIDIA A100" in oom_report.oom_scenario("fragmentation", gpu="A100", path=str(path))


def test_a_one_scenario_oom_rerun_on_the_same_gpu_replaces_only_that_scenario(tmp_path):
    path = _copy(tmp_path, "oom.json")
    before = _rows_by_key(path, "H200", "scenario")
    rerun = _strip(before["two-instances"]) | {"instance_fractions": [0.5, 0.45]}
    report = oom_cli.record(_oom_doc("NVIDIA H200", {"two-instances": rerun}), path)
    after = _rows_by_key(path, "H200", "scenario")
    assert report.replaced == ["two-instances"] and not report.added and not report.kept
    assert after["two-instances"]["instance_fractions"] == [0.5, 0.45]
    assert after["two-instances"]["run"]["date"] == "2030-01-01"
    for name in ("kv-too-small", "prefill-activation", "fragmentation"):
        assert after[name] == before[name]


def test_a_failing_oom_scenario_does_not_replace_a_passing_one(tmp_path):
    path = _copy(tmp_path, "oom.json")
    before = _rows_by_key(path, "H200", "scenario")
    failed = _strip(before["kv-too-small"]) | {"as_predicted": False}
    report = oom_cli.record(_oom_doc("NVIDIA H200", {"kv-too-small": failed}), path)
    assert report.kept == ["kv-too-small"] and "--replace" in str(report)
    assert _rows_by_key(path, "H200", "scenario") == before
    report = oom_cli.record(_oom_doc("NVIDIA H200", {"kv-too-small": failed}), path, replace=True)
    assert report.replaced == ["kv-too-small"]
    assert _rows_by_key(path, "H200", "scenario")["kv-too-small"]["ok"] is False


def test_a_failing_kv_check_keeps_the_three_passing_configurations(tmp_path):
    pytest.importorskip("torch")  # labs.kv_sizing.check imports it; the record step itself needs no GPU
    from labs.kv_sizing import check

    path = _copy(tmp_path, "kv_alloc_check.json")
    before = _rows_by_key(path, "H200", "label")
    assert len(before) == 3 and all(c["ok"] for c in before.values())
    bad = _strip(before["gqa-bf16"]) | {"ok": False}
    run = before["gqa-bf16"]["run"] | {"date": "2030-01-01"}
    report_doc = {**run, "lab": "kv_sizing.check", "gpu": "NVIDIA H200", "configs": [bad], "ok": False}
    report = check.record(report_doc, path)
    assert report.kept == ["gqa-bf16"] and not report.replaced
    assert "kept the passing row(s) gqa-bf16" in str(report)
    assert _rows_by_key(path, "H200", "label") == before
    # The page still shows three configurations, all passing.
    summary = kv_report.kv_alloc_check_summary(gpu="H200", path=str(path))
    assert summary.count("| pass |") == 3 and "**fail**" not in summary


def test_bench_of_one_shape_keeps_the_other_rows(tmp_path, monkeypatch):
    path = _copy(tmp_path, "paged_attention.json")
    monkeypatch.setattr(pa_report, "RESULTS_PATH", path)
    before = load_results(path).machine("H200")
    shapes = bench.table_rows(before.rows, "shapes")
    assert len(shapes) >= 6 and before.rows[0]["shape"] == "b1-l4k"
    row = _strip(before.row(shape="b1-l4k")) | {"time_us": 12.3}
    entry = {"gpu": "NVIDIA H200", **before.rows[0]["run"], "date": "2030-01-01", "rows": [row],
             "table": bench.format_table([row])}
    report = bench.record(entry, path)
    after = load_results(path).machine("H200")
    assert report.replaced == ["b1-l4k"]
    assert [r["shape"] for r in after.rows] == [r["shape"] for r in before.rows]
    assert after.row(shape="b1-l4k")["time_us"] == 12.3
    assert after.rows[1:] == before.rows[1:]
    # The printed tables cover every row, each under its own table.
    assert after.derived["table"] == bench.format_all(
        {key: bench.table_rows(after.rows, t) for t, key in bench.ENTRY_TABLES.items()})
    assert after.dates == f"{before.dates.split(' to ')[0]} to 2030-01-01"  # first date to the newest
    # What the pages ask for still renders: the next build does not fail.
    b32 = before.row(shape="b32-l4k")["time_us"]
    assert f"{b32:,.1f} µs" in pa_report.paged_attention_headline("b32-l4k", gpu="H200")
    assert "12.3 µs" in pa_report.paged_attention_headline("b1-l4k", gpu="H200")
    assert pa_report.paged_attention_results_table(gpu="H200").count("| `b") == 2 * len(shapes)  # compact and full table


def test_bench_record_refuses_a_variant_configuration(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--record", "--tile-n", "128"])
    assert exc.value.code == 2
    assert "--record stores the kernel's default configuration; drop --tile-n" in capsys.readouterr().err


def test_a_truncated_results_file_names_the_file_and_position(tmp_path):
    path = _copy(tmp_path, "oom.json")
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(RecordedError, match=r"oom\.json:\d+:\d+: not valid JSON"):
        load_results(path)
    with pytest.raises(RecordedError, match="not valid JSON"):
        oom_report.oom_summary_table(gpu="H200", path=str(path))
    # The writer refuses to merge into it, and leaves it as it was for a human to restore.
    with pytest.raises(RecordedError, match="not valid JSON"):
        record_rows(path, "oom", Machine("NVIDIA H200"), [{"scenario": "x", "ok": True}], ["scenario"], RUN)
    assert path.read_text() == text[: len(text) // 2]


# ---------------------------------------------------------------------------
# The writer's own rules
# ---------------------------------------------------------------------------


def test_a_write_that_cannot_serialise_leaves_the_old_file(tmp_path):
    path = _copy(tmp_path, "oom.json")
    old = path.read_bytes()
    with pytest.raises(RecordedError, match="not JSON.*the file is unchanged"):
        record_rows(path, "oom", Machine("NVIDIA H200"), [{"scenario": "x", "ok": True, "when": object()}],
                    ["scenario"], RUN)
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["oom.json"]  # no temporary file left


def test_a_write_interrupted_before_the_rename_leaves_the_old_file(tmp_path, monkeypatch):
    path = _copy(tmp_path, "oom.json")
    old = path.read_bytes()

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        record_rows(path, "oom", Machine("NVIDIA H200"), [{"scenario": "x", "ok": True}], ["scenario"], RUN)
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["oom.json"]


def test_first_write_creates_the_file_and_the_reader_reads_it_back(tmp_path):
    path = tmp_path / "sub" / "lab.json"
    assert load_results(path) is None
    rows = [{"shape": "a", "ok": True, "t": 1.5}, {"shape": "b", "ok": False, "t": 2.5}]
    report = record_rows(path, "lab", Machine("GPU X"), rows, ["shape"], RUN)
    assert report.added == ["a", "b"] and str(report).startswith("recorded 2 row(s) for GPU X in ")
    m = load_results(path).machine("gpu x")
    assert [(r["shape"], r["ok"], r["t"], r["run"]) for r in m.rows] == [("a", True, 1.5, RUN), ("b", False, 2.5, RUN)]
    assert m.runs == [RUN] and m.dates == "2030-01-01"
    doc = json.loads(path.read_text())
    assert doc["schema"] == recorded.SCHEMA and doc["key"] == ["shape"] and list(doc["machines"]) == ["GPU X"]


def test_machines_are_told_apart_by_count_and_interconnect(tmp_path):
    path = tmp_path / "lab.json"
    one, eight = Machine("NVIDIA H200"), Machine("NVIDIA H200", 8, "NVLink")
    record_rows(path, "lab", one, [{"shape": "a", "ok": True, "t": 1}], ["shape"], RUN)
    record_rows(path, "lab", eight, [{"shape": "a", "ok": True, "t": 8}], ["shape"], RUN)
    results = load_results(path)
    assert sorted(results.machines) == ["8x NVIDIA H200 (NVLink)", "NVIDIA H200"]
    assert results.machine("H200").row(shape="a")["t"] == 1
    assert results.machine("H200", count=8).row(shape="a")["t"] == 8
    assert not results.has("H200", count=4)
    with pytest.raises(RecordedError, match=r"count=2 matches no recorded machine; recorded: \["):
        results.machine("H200", count=2)


def test_a_gpu_name_that_matches_two_machines_is_an_error(tmp_path):
    path = tmp_path / "lab.json"
    for gpu in ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"):
        record_rows(path, "lab", Machine(gpu), [{"shape": "a", "ok": True}], ["shape"], RUN)
    results = load_results(path)
    with pytest.raises(RecordedError, match="matches 2"):
        results.machine("H100")
    assert results.machine("NVIDIA H100 PCIe").label == "NVIDIA H100 PCIe"


@pytest.mark.parametrize(("args", "message"), [
    (("",), "gpu must be the GPU's name"),
    (("G", 0), "count must be an integer >= 1"),
    (("G", 2), "name the interconnect"),
    (("G", 1, "NVLink"), "one GPU has no interconnect"),
])
def test_bad_machines_are_refused(args, message):
    with pytest.raises(RecordedError, match=message):
        Machine(*args)


@pytest.mark.parametrize(("rows", "key", "run", "message"), [
    ([{"ok": True}], ["shape"], RUN, r"row 0 lacks its key field\(s\) \['shape'\]"),
    ([{"shape": "a"}], ["shape"], RUN, 'row a needs "ok": true or false'),
    ([{"shape": "a", "ok": True}] * 2, ["shape"], RUN, "two rows with the key a"),
    ([{"shape": "a", "ok": True}], [], RUN, "at least one key field"),
    ([{"shape": "a", "ok": True}], ["shape"], {"driver": "1"}, "'date'"),
])
def test_bad_rows_are_refused_before_anything_is_written(tmp_path, rows, key, run, message):
    path = tmp_path / "lab.json"
    with pytest.raises(RecordedError, match=message):
        record_rows(path, "lab", Machine("G"), rows, key, run)
    assert not path.exists()


def test_a_file_of_another_lab_or_key_is_not_merged_into(tmp_path):
    path = _copy(tmp_path, "oom.json")
    with pytest.raises(RecordedError, match="holds lab 'oom' keyed by \\['scenario'\\]"):
        record_rows(path, "paged_attention", Machine("G"), [{"shape": "a", "ok": True}], ["shape"], RUN)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(schema=1), 'expected a recorded-results file with "schema": 2'),
    (lambda d: d.pop("key"), "needs 'lab'"),
    (lambda d: d["machines"]["NVIDIA H200"]["rows"][0].pop("ok"), r"row 0 lacks \['ok'\]"),
    (lambda d: d["machines"].update({"Other": d["machines"]["NVIDIA H200"]}), "filed under the wrong name"),
    (lambda d: d["machines"]["NVIDIA H200"].update(machine={"gpu": "NVIDIA H200", "count": 2}),
     "name the interconnect"),
])
def test_a_malformed_file_names_the_file_and_what_is_wrong(tmp_path, edit, message):
    path = _copy(tmp_path, "oom.json")
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(RecordedError, match=message) as exc:
        load_results(path)
    assert str(path) in str(exc.value) or "oom.json" in str(exc.value)


def test_derived_fields_are_recomputed_from_all_rows(tmp_path):
    path = tmp_path / "lab.json"

    def count(rows):
        return {"n": len(rows), "shapes": [r["shape"] for r in rows]}

    record_rows(path, "lab", Machine("G"), [{"shape": "a", "ok": True}], ["shape"], RUN, derive=count)
    record_rows(path, "lab", Machine("G"), [{"shape": "b", "ok": True}], ["shape"], RUN, derive=count)
    assert load_results(path).machine("G").derived == {"n": 2, "shapes": ["a", "b"]}


def test_every_recorded_file_in_the_repository_reads():
    files = recorded.check_all()
    assert {p.name for p in files} >= {"oom.json", "kv_alloc_check.json", "paged_attention.json"}
    for path in files:
        results = load_results(path)
        assert results.machines, f"{path.name} records no machine"


TOPO = """\
\tGPU0\tGPU1\tGPU2\tCPU Affinity
GPU0\t X \tNV18\tSYS\t0-31
GPU1\tNV18\t X \tSYS\t0-31
GPU2\tSYS\tSYS\t X \t32-63
"""


def test_interconnect_from_nvidia_smi_topology():
    assert recorded.interconnect_from_topology(TOPO, 2) == "NVLink"
    assert recorded.interconnect_from_topology(TOPO, 3) == "PCIe"


def test_the_writer_is_torch_and_pydantic_free():
    import subprocess
    import sys

    code = ("import sys; import labs.recorded; "
            "assert not {'torch', 'pydantic', 'yaml'} & set(sys.modules), sorted(sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=recorded.ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(recorded.ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]


# ---------------------------------------------------------------------------
# The site build: a second GPU renders, a broken file stops it with a clean line
# ---------------------------------------------------------------------------


@pytest.fixture
def fixture_site(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("pydantic")
    from site_helpers import copy_site

    root = copy_site(tmp_path / "site")
    (root / "labs" / "results").mkdir()
    for name in ("oom.json", "paged_attention.json", "kv_alloc_check.json"):
        shutil.copyfile(RESULTS / name, root / "labs" / "results" / name)
    (root / "docs" / "index.md").write_text(
        "---\nrender_macros: true\n---\n# Results\n\n"
        '{{ paged_attention_headline("b32-l4k", gpu="H200") }}\n\n'
        '{{ paged_attention_results_table(gpu="H200") }}\n\n'
        '{{ paged_attention_plot(gpu="H200", table=False) }}\n\n'
        '{{ paged_attention_headline("b1-l4k", gpu="A100") }}\n\n'
        '{{ oom_summary_table(gpu="H200") }}\n\n'
        '{{ kv_alloc_check_summary(gpu="H200") }}\n', encoding="utf-8")
    return root


def test_a_second_gpu_recorded_and_the_build_still_passes(fixture_site, tmp_path):
    from site_helpers import mkdocs_build

    path = fixture_site / "labs" / "results" / "paged_attention.json"
    h200 = load_results(path).machine("H200")
    row = _strip(h200.row(shape="b1-l4k")) | {"time_us": 31.4}
    bench.record({"gpu": "NVIDIA A100-SXM4-80GB", **h200.rows[0]["run"], "date": "2030-01-01", "rows": [row]}, path)
    result = mkdocs_build(fixture_site, tmp_path / "out")
    assert result.returncode == 0, result.stderr[-3000:]
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert "On an NVIDIA H200 (measured" in page and "On an NVIDIA A100-SXM4-80GB (measured 2030-01-01)" in page
    assert "31.4 µs" in page


def test_a_truncated_results_file_fails_the_build_with_its_name_and_position(fixture_site, tmp_path):
    from site_helpers import mkdocs_build

    path = fixture_site / "labs" / "results" / "oom.json"
    text = path.read_text()
    path.write_text(text[:5000])
    result = mkdocs_build(fixture_site, tmp_path / "out")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "recorded lab results: labs/results/oom.json:" in output and ": not valid JSON" in output, output[-3000:]
    assert "Traceback" not in output and "JSONDecodeError" not in output


def test_recorded_machine_names_the_command_when_nothing_is_recorded_and_the_machines_when_one_is_missing(tmp_path):
    class PageError(ValueError):
        pass

    path = tmp_path / "lab.json"
    with pytest.raises(PageError, match=r"no lab rows in .*lab\.json; record them with `python -m labs\.x --record`, or"):
        recorded.recorded_machine(path, "H200", what="lab rows", command="python -m labs.x --record", error=PageError,
                                  hint=", or not")
    recorded.record_rows(path, "lab", recorded.Machine("NVIDIA H200"), [{"name": "a", "ok": True}], ["name"],
                         {"date": "2026-12-01"})
    assert recorded.recorded_machine(path, "H200", what="lab rows", command="c").row(name="a")["ok"] is True
    with pytest.raises(PageError, match=r"lab rows: .*matches no recorded machine; recorded: \['NVIDIA H200'\]"):
        recorded.recorded_machine(path, "A100", what="lab rows", command="c", error=PageError)
