"""bench/plots.py draws the docs' charts from the benches' JSON: small made-up results of each
kind go in, a PNG per chart and figures.json come out (the docs' tables read the latter)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.docs


def _merge_result(engines: list[str], seconds: dict[str, float], started: str) -> dict:
    return {
        "meta": {"started_at": started, "command": "python -m bench.merge_bench", "machine": {"cpus": 2},
                 "target_rows": 1_000_000, "engines": engines},
        "scenarios": [{"batch_size": 100_000, "key_dist": "uniform", "median_seconds": seconds}],
    }


def _write(folder: Path, name: str, data: dict) -> None:
    (folder / name).write_text(json.dumps(data))


def test_plots_from_results(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from bench import plots

    results, out = tmp_path / "results", tmp_path / "img"
    results.mkdir()
    _write(results, "old.json", _merge_result(["ours", "delta-rs", "spark-floor"],
                                              {"ours": 9.0, "delta-rs": 1.0, "spark-floor": 5.0}, "2026-01-01"))
    _write(results, "floor.json", _merge_result(["ours", "ours-dv", "delta-rs", "spark-floor"],
                                                {"ours": 2.0, "ours-dv": 1.5, "delta-rs": 0.5, "spark-floor": 1.0},
                                                "2026-02-01"))
    _write(results, "cdf.json", _merge_result(["ours", "ours-cdf", "delta-rs"],
                                              {"ours": 2.0, "ours-cdf": 2.4, "delta-rs": 0.5}, "2026-02-01"))
    _write(results, "dv_scan.json", {
        "benchmark": "dv_scan", "created": "2026-02-01", "command": "python -m bench.dv_scan_bench",
        "config": {"target_rows": 3_000_000, "target_files": 20, "delete_fraction": 0.1},
        "summary": {e: {"dv": {"ms": 400.0}, "compacted": {"ms": 300.0}, "ratio": 1.33, "coldDvMs": 900.0}
                    for e in ("ours", "delta-rs")}})
    for writer in ("ours", "delta-rs"):
        _write(results, f"cdf_read_{writer}.json", {
            "when": "2026-02-01", "args": {"writer": writer, "stream": True, "versions": 10, "batch_rows": 100_000,
                                           "target_rows": 1_000_000},
            "table": {"expectedRows": 1_800_000},
            "summary": {"ours": {"medianMs": 300.0, "rowsPerSecond": 6e6},
                        "delta-rs": {"medianMs": 100.0, "rowsPerSecond": 1.8e7},
                        "stream": {"medianMs": 1200.0, "rowsPerSecond": 1.5e6}, "ratioOursToDeltaRs": 3.0}})
    _write(results, "unrelated.json", {"something": "else"})

    assert plots.main(["--results", str(results), "--out", str(out)]) == 0

    for name in ("merge-engines.png", "merge-cdf.png", "dv-scan.png", "cdf-read.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    figures = json.loads((out / "figures.json").read_text())
    merge = figures["merge"]
    assert merge["source"]["file"] == "floor.json"  # the newest file with spark-floor
    assert merge["engines"] == ["ours", "ours-dv", "delta-rs", "spark-floor"]
    assert merge["rows"][0]["x_delta_rs"] == {"ours": 4.0, "ours-dv": 3.0, "spark-floor": 2.0}
    assert figures["merge_cdf"]["rows"][0]["seconds"]["ours-cdf"] == 2.4
    assert [r["engine"] for r in figures["dv_scan"]["rows"]] == ["ours", "delta-rs"]
    assert [r["writer"] for r in figures["cdf_read"]["rows"]] == ["ours", "delta-rs"]


def test_no_results(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from bench import plots

    assert plots.main(["--results", str(tmp_path), "--out", str(tmp_path / "img")]) == 1
