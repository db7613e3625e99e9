"""The two diagrams of "How it works", as SVG files written into docs/img/ (committed).

    python docs/diagrams.py

Plain SVG, no JavaScript and no fonts to fetch, so the pages show them offline. Each box is a
phase; its badge says which Spark jobs it runs (counted by Spark's status tracker, as the tests
count them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from pathlib import Path

FONT = "font-family='-apple-system, Segoe UI, Helvetica, Arial, sans-serif'"
DRIVER = "#eef1fb"  # work on the driver
SPARK = "#fff3e0"  # Spark jobs
BORDER = {DRIVER: "#3f51b5", SPARK: "#ef6c00", "#f5f5f5": "#9e9e9e"}


@dataclass
class Box:
    x: int
    y: int
    w: int
    title: str
    lines: list[str] = field(default_factory=list)
    fill: str = DRIVER
    badge: str = ""

    @property
    def h(self) -> int:
        return 30 + 15 * len(self.lines)

    def top(self) -> tuple[int, int]:
        return self.x + self.w // 2, self.y

    def bottom(self) -> tuple[int, int]:
        return self.x + self.w // 2, self.y + self.h

    def left(self) -> tuple[int, int]:
        return self.x, self.y + self.h // 2

    def right(self) -> tuple[int, int]:
        return self.x + self.w, self.y + self.h // 2

    def svg(self) -> str:
        parts = [f"<rect x='{self.x}' y='{self.y}' width='{self.w}' height='{self.h}' rx='8' fill='{self.fill}' "
                 f"stroke='{BORDER.get(self.fill, '#616161')}' stroke-width='1.5'/>",
                 f"<text x='{self.x + 10}' y='{self.y + 19}' font-size='13' font-weight='bold' fill='#212121'>"
                 f"{escape(self.title)}</text>"]
        for i, line in enumerate(self.lines):
            parts.append(f"<text x='{self.x + 10}' y='{self.y + 37 + 15 * i}' font-size='11.5' fill='#424242'>"
                         f"{escape(line)}</text>")
        if self.badge:
            width = 7 * len(self.badge) + 12
            parts.append(f"<rect x='{self.x + self.w - width - 6}' y='{self.y + 6}' width='{width}' height='18' "
                         f"rx='9' fill='{BORDER.get(self.fill, '#616161')}'/>")
            parts.append(f"<text x='{self.x + self.w - width // 2 - 6}' y='{self.y + 19}' font-size='11' "
                         f"fill='white' text-anchor='middle'>{escape(self.badge)}</text>")
        return "\n".join(parts)


def arrow(points: list[tuple[int, int]], label: str = "", dashed: bool = False, label_at: int = 0) -> str:
    path = " ".join(f"{x},{y}" for x, y in points)
    dash = " stroke-dasharray='5,4'" if dashed else ""
    out = [f"<polyline points='{path}' fill='none' stroke='#616161' stroke-width='1.4'{dash} "
           f"marker-end='url(#arrow)'/>"]
    if label:
        (x1, y1), (x2, y2) = points[label_at], points[label_at + 1]
        dx, dy = (-8, -6) if y1 == y2 else (6, 4)  # above a horizontal segment, beside a vertical one
        out.append(f"<text x='{(x1 + x2) // 2 + dx}' y='{(y1 + y2) // 2 + dy}' font-size='11' fill='#616161' "
                   f"font-style='italic'>{escape(label)}</text>")
    return "\n".join(out)


def document(width: int, height: int, title: str, items: list[str]) -> str:
    legend = (f"<rect x='{width - 300}' y='12' width='14' height='14' rx='3' fill='{DRIVER}' "
              f"stroke='{BORDER[DRIVER]}'/>"
              f"<text x='{width - 280}' y='24' font-size='11' fill='#424242'>driver</text>"
              f"<rect x='{width - 220}' y='12' width='14' height='14' rx='3' fill='{SPARK}' stroke='{BORDER[SPARK]}'/>"
              f"<text x='{width - 200}' y='24' font-size='11' fill='#424242'>Spark job(s)</text>")
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}' {FONT}>\n"
            f"<title>{escape(title)}</title>\n"
            "<defs><marker id='arrow' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='7' markerHeight='7' "
            "orient='auto-start-reverse'><path d='M 0 0 L 10 5 L 0 10 z' fill='#616161'/></marker></defs>\n"
            f"<rect width='{width}' height='{height}' fill='white'/>\n"
            f"<text x='16' y='26' font-size='15' font-weight='bold' fill='#212121'>{escape(title)}</text>\n"
            + legend + "\n" + "\n".join(items) + "\n</svg>\n")


def merge_phases() -> str:
    snap = Box(300, 50, 420, "1. Snapshot the target", ["the Delta log, loaded once (delta-rs)",
                                                         "schema, files, per-file stats, txns"])
    skip = Box(300, 130, 420, "2. Data skipping", ["partition values and min/max stats of target-only",
                                                   "conjuncts; the source's key range; key presence per file"])
    mat = Box(300, 225, 420, "3. Materialize the source", ["localCheckpoint at storage_levels[attempt];",
                                                           "observes row count, key ranges, key presence",
                                                           "(insert-only: counted, not copied)"],
              fill=SPARK, badge="1 job")
    ins = Box(20, 360, 220, "Insert-only", ["left-anti join against the", "data-skipped files; write"],
              fill=SPARK, badge="1 job")
    one = Box(260, 360, 240, "One pass", ["rewrite every candidate; observe", "touched files, joined rows",
                                          "(map-side past 16 MB + broadcast);",
                                          "a wrong guess: the two passes"], fill=SPARK, badge="1-2 jobs")
    two = Box(520, 360, 250, "Delta's two passes", ["findTouchedFiles: join, multiple-",
                                                    "match check, touched files;",
                                                    "writeAllChanges: rewrite them"],
              fill=SPARK, badge="2-3 jobs")
    dv = Box(790, 360, 220, "Deletion vectors", ["join + write changed rows,", "observe row positions;",
                                                 "new DVs on the driver"], fill=SPARK, badge="2 jobs")
    commit = Box(300, 520, 420, "4. Commit", ["conflict checks against commits since the snapshot;",
                                              "put-if-absent JSON: adds, removes, DVs, cdc, txn, metrics"])
    items = [b.svg() for b in (snap, skip, mat, ins, one, two, dv, commit)]
    items += [arrow([snap.bottom(), skip.top()]), arrow([skip.bottom(), mat.top()])]
    y_split = mat.y + mat.h + 22
    for box, label in ((ins, "no MATCHED clause"), (one, "rows per file >= 8"), (two, "otherwise"),
                       (dv, "table has DVs")):
        x = box.top()[0]
        items.append(arrow([(mat.bottom()[0], mat.bottom()[1]), (mat.bottom()[0], y_split), (x, y_split),
                            box.top()]))
        items.append(f"<text x='{x + 5}' y='{y_split + 16}' font-size='10.5' fill='#616161' font-style='italic'>"
                     f"{escape(label)}</text>")
    items.append(arrow([one.right(), (two.x, one.right()[1])], dashed=True))
    y_join = commit.y - 30
    for box in (ins, one, two, dv):
        items.append(arrow([box.bottom(), (box.bottom()[0], y_join), (commit.top()[0], y_join), commit.top()]))
    items.append("<text x='740' y='550' font-size='11' fill='#424242'>on a lost materialized block: back</text>")
    items.append("<text x='740' y='565' font-size='11' fill='#424242'>to 3 at the next storage level</text>")
    items.append("<text x='740' y='580' font-size='11' fill='#424242'>(max_attempts, 4)</text>")
    return document(1030, 610, "The phases of a MERGE (upsert: at most 4 Spark jobs)", items)


def sink_batch() -> str:
    txn = Box(260, 50, 440, "1. Is the batch applied? txn(app_id) >= batchId", [
        "the target's log followed from batch to batch (only new commits read)"])
    skipped = Box(760, 42, 230, "skip", ["report skipped=true", "(a replay after a crash)"], fill="#f5f5f5")
    mat = Box(260, 140, 440, "2. Materialize the batch once", [
        "newest event per key (sequence_by), deletes flagged,",
        "NULL keys to the dead letter; counts, key ranges and",
        "key presence observed; late events dropped here when",
        "the tombstones are few"], fill=SPARK, badge="1 job")
    tomb = Box(140, 280, 770, "3. Tombstone lookup", [
        "the tombstone files whose key range overlaps the batch's, chosen on the driver from their stats;",
        "none when none overlaps or all are older than the batch's oldest event"], fill=SPARK, badge="0-1 job")
    merge = Box(140, 385, 400, "4. MERGE with txn(app_id, batchId)", [
        "events older than the table's rows dropped; one pass or",
        "rewrite of every candidate; small tables rewritten whole"], fill=SPARK, badge="2-3 jobs")
    append = Box(580, 385, 330, "beside it: append the batch's deletes", [
        "to <target>_tombstones, in a thread;",
        "committed before the MERGE commits"], fill=SPARK, badge="1 job")
    commit = Box(260, 490, 440, "5. Commit and report", [
        "one commit: data files and the txn; MergeProgress recorded;",
        "then optional auto compaction (its own commit)"])
    items = [b.svg() for b in (txn, skipped, mat, tomb, merge, append, commit)]
    items += [arrow([txn.right(), skipped.left()], "yes"),
              arrow([txn.bottom(), mat.top()], "no"),
              arrow([mat.bottom(), (mat.bottom()[0], tomb.y)]),
              arrow([(merge.top()[0], tomb.bottom()[1]), merge.top()]),
              arrow([(append.top()[0], tomb.bottom()[1]), append.top()], "in parallel"),
              arrow([merge.bottom(), (merge.bottom()[0], commit.y)]),
              arrow([append.bottom(), (append.bottom()[0], commit.right()[1]), commit.right()], dashed=True),
              arrow([merge.left(), (90, merge.left()[1]), (90, mat.left()[1]), mat.left()], dashed=True)]
    items.append("<text x='18' y='300' font-size='11' fill='#424242'>lost block or</text>")
    items.append("<text x='18' y='314' font-size='11' fill='#424242'>conflict: rerun</text>")
    items.append("<text x='18' y='328' font-size='11' fill='#424242'>the batch</text>")
    return document(1010, 580, "The phases of a MergeSink batch (SCD 1 with tombstones: at most 6 Spark jobs)", items)


def main() -> None:
    out = Path(__file__).parent / "img"
    out.mkdir(exist_ok=True)
    for name, svg in (("merge-phases.svg", merge_phases()), ("sink-batch.svg", sink_batch())):
        (out / name).write_text(svg)
        print(f"wrote {out / name}")


if __name__ == "__main__":
    main()
