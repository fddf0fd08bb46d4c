"""``evenflow loadtest compare DIR...``: one table and one plot from several result folders."""

from __future__ import annotations

import json
from pathlib import Path

from evenflow.loadtest.report import _save, csv_row, plt


def compare(dirs: list[Path], out: Path | None = None) -> str:
    runs = []
    for directory in dirs:
        payload = json.loads((directory / "results.json").read_text())
        runs.append((payload.get("label") or directory.name, payload))
    lines = [f"{'run':>20} {'point':>12} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, payload in runs:
        rows = [csv_row(p) for p in payload["points"]]
        for row in rows:
            unit = "conc" if row["mode"] == "concurrency" else "req/s"
            lines.append(f"{label:>20} {row['value']:>7g} {unit:>4} {row['throughput_per_s']:>9.1f}"
                         f" {row['p50_ms']:>8.2f} {row['p99_ms']:>8.2f} {row['errors']:>7}")
        ax.plot([r["throughput_per_s"] for r in rows], [r["p99_ms"] for r in rows], "o-",
                label=f"{label} p99")
    ax.set_xlabel("throughput (req/s)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_title("compare")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    target = out or dirs[0].parent
    target.mkdir(parents=True, exist_ok=True)
    plot = _save(fig, target / "compare.png")
    lines.append(f"plot: {target / plot}")
    return "\n".join(lines)
