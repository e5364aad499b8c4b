"""The server-sweep macros render the recorded H200 sweep, and refuse points it does not hold."""

from __future__ import annotations

import pytest

from labs.loadgen import report


def test_tables_and_knee_come_from_the_recorded_file():
    table = report.sweep_table("concurrency", gpu="H200")
    assert table.count("\n") >= 3 and "(knee)" in table
    knee = report.sweep_knee("concurrency", gpu="H200")
    rows = sorted((r for r in report._rows("concurrency", "H200")), key=lambda r: r["load"])
    assert knee is not None and knee in rows
    assert all(r["little_ok"] for r in rows)  # L and lambda*W agree at every recorded point


def test_floor_comes_from_the_cost_model():
    f = report.sweep_tpot_floor(1, gpu="H200")
    assert 0 < f["floor_s"] < f["measured_s"] and f["ratio"] == pytest.approx(f["measured_s"] / f["floor_s"])


def test_unknown_points_are_errors():
    with pytest.raises(report.ReportError, match="recorded"):
        report.sweep_point("concurrency", 3, gpu="H200")
    with pytest.raises(report.ReportError):
        report.sweep_table("burst", gpu="H200")
