"""Charts of the benchmark results for the documentation.

    python -m bench.plots [--results bench/results] [--out docs/img]

Reads the JSON files the benches write into ``bench/results/`` and draws PNG charts into
``docs/img/`` (committed, so building the docs runs no bench), plus ``figures.json`` beside them:
the plotted numbers with the file, command and date each came from, which the docs' Benchmarks
page shows as tables. Each kind of result is recognised by its shape, whatever its file name;
where several files hold one kind, the newest (by the date inside) is drawn.

* ``merge-engines.png``: ``merge_bench`` (a file whose engines include ``spark-floor``, else
  ``delta-rs``): median seconds per scenario of ours (copy-on-write and, when run, with deletion
  vectors), delta-rs' MERGE and Spark's floor (Spark's own read, broadcast join and write of
  exactly the files delta-rs rewrote), with each bar's multiple of delta-rs.
* ``merge-cdf.png``: ``merge_bench`` with ``ours-cdf``: the MERGE with the change data feed on
  and off, copy-on-write and deletion vectors.
* ``dv-scan.png``: ``dv_scan_bench``: a full scan of a table whose deletion vectors delete 10 %
  of its rows against the same live rows compacted, ours and delta-rs.
* ``cdf-read.png``: ``cdf_read_bench`` (``--writer ours`` and delta-rs' writer): change rows per
  second read by ``changes()``, the ``delta_changes`` stream and delta-rs' ``load_cdf``.

Needs matplotlib (``pip install -e '.[docs]'``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

COLORS = {
    "ours": "#3f51b5",
    "ours-dv": "#7986cb",
    "ours-cdf": "#1a237e",
    "ours-dv-cdf": "#9fa8da",
    "delta-rs": "#ef6c00",
    "spark-floor": "#9e9e9e",
    "spark-naive": "#616161",
    "duckdb": "#2e7d32",
    "floor": "#bdbdbd",
    "delta-rs-streamed": "#ffb74d",
}
LABELS = {
    "ours": "ours (copy-on-write)",
    "ours-dv": "ours, deletion vectors",
    "ours-cdf": "ours, change data feed",
    "ours-dv-cdf": "ours, DVs + change data feed",
    "delta-rs": "delta-rs MERGE",
    "spark-floor": "Spark's floor (read + broadcast join + write)",
    "spark-naive": "naive Spark rewrite",
    "duckdb": "DuckDB (not Delta)",
    "floor": "pyarrow I/O floor",
}


# ------------------------------------------------------------------ reading


def load_results(folder: Path) -> dict[str, list[tuple[Path, dict[str, Any]]]]:
    """The result files by kind, newest first."""
    kinds: dict[str, list[tuple[str, Path, dict[str, Any]]]] = {}
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"skipped {path}: {exc}", file=sys.stderr)
            continue
        kind = kind_of(data)
        if kind is None:
            continue
        kinds.setdefault(kind, []).append((when_of(data), path, data))
    return {kind: [(p, d) for _, p, d in sorted(found, key=lambda t: t[0], reverse=True)]
            for kind, found in kinds.items()}


def kind_of(data: dict[str, Any]) -> str | None:
    if "scenarios" in data and "meta" in data:
        return "merge_bench"
    if data.get("benchmark") == "dv_scan":
        return "dv_scan"
    if "ratioOursToDeltaRs" in data.get("summary", {}):
        return "cdf_read"
    return None


def when_of(data: dict[str, Any]) -> str:
    return str(data.get("meta", {}).get("started_at") or data.get("created") or data.get("when") or "")


def command_of(data: dict[str, Any]) -> str:
    if "meta" in data:
        return str(data["meta"].get("command", "python -m bench.merge_bench"))
    if "command" in data:
        return str(data["command"])
    args = data.get("args", {})
    flags = [f"--writer {args['writer']}"] if args.get("writer") else []
    flags += ["--stream"] if args.get("stream") else []
    return " ".join(["python -m bench.cdf_read_bench", *flags])


def _source(path: Path, data: dict[str, Any]) -> dict[str, str]:
    return {"file": path.name, "when": when_of(data)[:10], "command": command_of(data)}


# ------------------------------------------------------------------ figures


def merge_figures(data: dict[str, Any], engines: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for scenario in data["scenarios"]:
        seconds = {e: s for e, s in scenario["median_seconds"].items() if e in engines and s is not None}
        base = seconds.get("delta-rs")
        rows.append({
            "scenario": f"{data['meta']['target_rows'] / 1e6:g}M x {scenario['batch_size'] // 1000}k "
                        f"{scenario['key_dist']}",
            "seconds": {e: round(s, 3) for e, s in seconds.items()},
            "x_delta_rs": {e: round(s / base, 2) for e, s in seconds.items() if base and e != "delta-rs"},
        })
    return rows


def _engines_in(data: dict[str, Any], wanted: Sequence[str]) -> list[str]:
    present = set(data["meta"]["engines"])
    return [e for e in wanted if e in present]


# ------------------------------------------------------------------ drawing


def _axes(title: str, subtitle: str, footer: str, width: float = 9.0, height: float = 4.6) -> tuple[Any, Any]:
    import textwrap

    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height), dpi=110)
    fig.suptitle(title, fontsize=12, fontweight="bold", x=0.01, ha="left")
    ax.set_title(subtitle, fontsize=8.5, color="#444444", loc="left")
    lines = textwrap.wrap(footer, width=int(width * 17))
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=6.5, color="#666666", ha="left", va="bottom",
             family="monospace")
    fig.subplots_adjust(bottom=0.1 + 0.03 * len(lines))
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="y", color="#e0e0e0", linewidth=0.8)
    ax.set_axisbelow(True)
    return fig, ax


def _grouped_bars(ax: Any, groups: list[str], series: dict[str, list[float | None]],
                  notes: dict[str, list[str]] | None = None, unit: str = "s") -> None:
    import numpy as np

    n = max(1, len(series))
    width = 0.8 / n
    x = np.arange(len(groups))
    top = max((v for values in series.values() for v in values if v is not None), default=1.0)
    for i, (name, values) in enumerate(series.items()):
        heights = [v if v is not None else 0.0 for v in values]
        bars = ax.bar(x + (i - (n - 1) / 2) * width, heights, width * 0.92, label=LABELS.get(name, name),
                      color=COLORS.get(name))
        for j, (bar, value) in enumerate(zip(bars, values, strict=True)):
            if value is None:
                continue
            text = f"{value:g}{unit}" if unit else f"{value:g}"
            note = (notes or {}).get(name, [""] * len(values))[j]
            ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height() + top * 0.01,
                    text + (f"\n{note}" if note else ""), ha="center", va="bottom", fontsize=6.5)
    ax.set_xticks(x, groups, fontsize=9)
    ax.set_ylim(0, top * 1.45)  # room for the legend above the tallest bar and its label
    ax.legend(fontsize=8, frameon=False, loc="upper left", ncols=2)


def _save(fig: Any, out: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(out, format="png", metadata={"Software": None})
    plt.close(fig)
    print(f"wrote {out}")


def plot_merge(data: dict[str, Any], path: Path, out: Path, engines: Sequence[str], title: str,
               figures: dict[str, Any], key: str) -> None:
    rows = merge_figures(data, engines)
    present = [e for e in engines if any(e in r["seconds"] for r in rows)]
    fig, ax = _axes(title, "median seconds of the MERGE call (lower is better) and its multiple of delta-rs'",
                    f"{data['meta'].get('started_at', '')[:10]}, {data['meta']['machine']['cpus']} cores: "
                    f"{command_of(data)}")
    series = {e: [r["seconds"].get(e) for r in rows] for e in present}
    notes = {e: [f"{r['x_delta_rs'][e]:.1f}x" if e in r["x_delta_rs"] else "" for r in rows] for e in present}
    _grouped_bars(ax, [r["scenario"] for r in rows], series, notes)
    ax.set_ylabel("seconds")
    _save(fig, out)
    figures[key] = {"source": _source(path, data), "engines": present, "rows": rows}


def plot_dv_scan(data: dict[str, Any], path: Path, out: Path, figures: dict[str, Any]) -> None:
    summary = data["summary"]
    engines = [e for e in ("ours", "delta-rs") if e in summary]
    config = data.get("config", {})
    fig, ax = _axes("Full scan of a table with deletion vectors",
                    f"median ms (lower is better): {config.get('target_rows', 0) / 1e6:g}M rows in "
                    f"{config.get('target_files')} files, {config.get('delete_fraction', 0):.0%} deleted by DVs, "
                    "against the same live rows compacted",
                    f"{when_of(data)[:10]}: {command_of(data)}", width=7.5)
    groups = [{"ours": "ours (Spark, noop sink)", "delta-rs": "delta-rs scan() to Arrow"}[e] for e in engines]
    series = {"with DVs": [summary[e]["dv"]["ms"] for e in engines],
              "compacted": [summary[e]["compacted"]["ms"] for e in engines]}
    COLORS.setdefault("with DVs", "#7986cb")
    COLORS.setdefault("compacted", "#bdbdbd")
    notes = {"with DVs": [f"{summary[e]['ratio']:.2f}x compacted" for e in engines],
             "compacted": [""] * len(engines)}
    _grouped_bars(ax, groups, series, notes, unit=" ms")
    ax.set_ylabel("ms")
    _save(fig, out)
    figures["dv_scan"] = {"source": _source(path, data), "rows": [
        {"engine": e, "dv_ms": summary[e]["dv"]["ms"], "compacted_ms": summary[e]["compacted"]["ms"],
         "ratio": round(summary[e]["ratio"], 2), "cold_dv_ms": summary[e].get("coldDvMs")} for e in engines]}


def plot_cdf_read(found: list[tuple[Path, dict[str, Any]]], out: Path, figures: dict[str, Any]) -> None:
    by_writer: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path, data in found:  # newest first: keep the newest per writer
        by_writer.setdefault(str(data.get("args", {}).get("writer", "?")), (path, data))
    writers = sorted(by_writer, key=lambda w: w != "ours")
    readers = [("ours", "changes() (Spark, noop sink)"), ("stream", "delta_changes stream"),
               ("delta-rs", "delta-rs load_cdf to Arrow")]
    COLORS.update({"changes() (Spark, noop sink)": COLORS["ours"], "delta_changes stream": COLORS["ours-dv"],
                   "delta-rs load_cdf to Arrow": COLORS["delta-rs"]})
    first = by_writer[writers[0]][1]
    args = first.get("args", {})
    fig, ax = _axes("Reading the change data feed",
                    f"million change rows per second (higher is better): {args.get('versions')} versions of "
                    f"{args.get('batch_rows', 0) // 1000}k-row upserts into {args.get('target_rows', 0) / 1e6:g}M rows",
                    f"{when_of(first)[:10]}: python -m bench.cdf_read_bench --writer ours|delta-rs --stream", width=8)
    series: dict[str, list[float | None]] = {}
    rows = []
    for reader, label in readers:
        values: list[float | None] = []
        for writer in writers:
            summary = by_writer[writer][1]["summary"]
            rate = summary.get(reader, {}).get("rowsPerSecond")
            values.append(round(rate / 1e6, 2) if rate else None)
        series[label] = values
    for writer in writers:
        path, data = by_writer[writer]
        summary = data["summary"]
        rows.append({"writer": writer, "source": _source(path, data), "change_rows": data["table"]["expectedRows"],
                     **{reader: {"ms": summary[reader]["medianMs"], "rows_per_s": summary[reader]["rowsPerSecond"]}
                        for reader, _ in readers if reader in summary}})
    _grouped_bars(ax, [f"table written by {'ours' if w == 'ours' else w}" for w in writers], series, unit="M/s")
    ax.set_ylabel("million rows / s")
    _save(fig, out)
    figures["cdf_read"] = {"rows": rows}


# ------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Draw the benchmark charts of the docs from bench/results/*.json.")
    parser.add_argument("--results", default="bench/results", help="folder of the benches' JSON results")
    parser.add_argument("--out", default="docs/img", help="folder for the PNG charts and figures.json")
    args = parser.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "streaming_merge"
    results = load_results(Path(args.results))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures_path = out / "figures.json"
    figures: dict[str, Any] = json.loads(figures_path.read_text()) if figures_path.exists() else {}

    merges = results.get("merge_bench", [])
    with_floor = [(p, d) for p, d in merges if "spark-floor" in d["meta"]["engines"]]
    for path, data in (with_floor or merges)[:1]:
        plot_merge(data, path, out / "merge-engines.png",
                   _engines_in(data, ["ours", "ours-dv", "delta-rs", "spark-floor", "spark-naive"]),
                   "Upsert MERGE into a 1M-row Delta table: ours, delta-rs and Spark's floor", figures, "merge")
    for path, data in [(p, d) for p, d in merges if "ours-cdf" in d["meta"]["engines"]][:1]:
        plot_merge(data, path, out / "merge-cdf.png",
                   _engines_in(data, ["ours", "ours-cdf", "ours-dv", "ours-dv-cdf", "delta-rs"]),
                   "What the change data feed costs a MERGE", figures, "merge_cdf")
    for path, data in results.get("dv_scan", [])[:1]:
        plot_dv_scan(data, path, out / "dv-scan.png", figures)
    if results.get("cdf_read"):
        plot_cdf_read(results["cdf_read"], out / "cdf-read.png", figures)
    if not results:
        print(f"no bench results in {args.results}: run a bench first (see bench/README.md)", file=sys.stderr)
        return 1
    figures_path.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    print(f"wrote {figures_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
