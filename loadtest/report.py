"""Result files: results.json (every number, command line, versions), results.csv (a row per
point), PNG plots and report.md embedding them."""

from __future__ import annotations

import csv
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from evenflow.loadtest.slo_search import Probe

CSV_FIELDS = ("mode", "value", "throughput_per_s", "p50_ms", "p90_ms", "p99_ms", "p99.9_ms",
              "max_ms", "ok", "errors", "generator_cpu_fraction", "schedule_lag_p99_ms",
              "server_queue_ms", "server_compute_ms")


def environment() -> dict[str, Any]:
    import grpc

    return {"command": " ".join(sys.argv), "python": platform.python_version(),
            "grpcio": grpc.__version__, "cores": os.cpu_count(), "platform": platform.platform()}


def csv_row(point: dict[str, Any]) -> dict[str, Any]:
    latency = point.get("latency_ms", {})
    statuses = point.get("status_counts", {})
    breakdown = point.get("server", {}).get("breakdown_ms", {})
    compute = sum(breakdown.get(k, 0.0) for k in ("compute_input", "compute_infer",
                                                   "compute_output"))
    return {"mode": point["mode"], "value": point["value"],
            "throughput_per_s": round(point["throughput_per_s"], 2),
            **{f"{k}_ms": round(latency.get(k, float("nan")), 3)
               for k in ("p50", "p90", "p99", "p99.9", "max")},
            "ok": statuses.get("OK", 0), "errors": sum(v for k, v in statuses.items() if k != "OK"),
            "generator_cpu_fraction": round(point["generator_cpu_fraction"], 3),
            "schedule_lag_p99_ms": round(point["schedule_lag_p99_ms"], 3),
            "server_queue_ms": round(breakdown.get("queue", float("nan")), 3),
            "server_compute_ms": round(compute, 3) if breakdown else float("nan")}


def write_results(out: Path, payload: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(payload, indent=2, default=str))
    with (out / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for point in payload["points"]:
            writer.writerow(csv_row(point))
    plots = draw_plots(out, payload)
    write_markdown(out, payload, plots)


def _label(point: dict[str, Any]) -> str:
    unit = "conc" if point["mode"] == "concurrency" else "req/s"
    return f"{point['value']:g} {unit}"


def draw_plots(out: Path, payload: dict[str, Any]) -> list[str]:
    points = payload["points"]
    drawn = []
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [p["throughput_per_s"] for p in points]
    for key in ("p50", "p99"):
        ax.plot(xs, [p["latency_ms"].get(key, float("nan")) for p in points], "o-", label=key)
    ax.set_xlabel("throughput (req/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title("latency vs throughput")
    ax.legend()
    ax.grid(alpha=0.3)
    drawn.append(_save(fig, out / "latency_vs_throughput.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for point in points:
        if point["cdf_ms"]:
            latencies, fractions = zip(*point["cdf_ms"], strict=True)
            ax.plot(latencies, fractions, label=_label(point))
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("latency CDF")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    drawn.append(_save(fig, out / "latency_cdf.png"))

    samples = [(i, s) for i, p in enumerate(points) for s in p.get("server", {}).get("samples", [])]
    if samples:
        for field, name, ylabel in (("busy_fraction", "busy_over_time.png", "busy fraction"),
                                    ("batch_size", "batch_size_over_time.png", "batch size")):
            fig, ax = plt.subplots(figsize=(7, 4))
            offsets = _time_offsets(points)
            for replica in sorted({s["replica"] for _, s in samples}):
                series = [(offsets[i] + s["t_s"], s[field]) for i, s in samples
                          if s["replica"] == replica]
                ax.plot(*zip(*series, strict=True), ".-", label=replica, markersize=3)
            ax.set_xlabel("time (s, points back to back)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{ylabel} per device over time")
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
            drawn.append(_save(fig, out / name))
    return drawn


def _time_offsets(points: list[dict[str, Any]]) -> list[float]:
    offsets, total = [], 0.0
    for point in points:
        offsets.append(total)
        total += point["duration_s"] + point.get("warmup_s", 0.0)
    return offsets


def _save(fig: Any, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def write_markdown(out: Path, payload: dict[str, Any], plots: list[str]) -> None:
    lines = [f"# Load test: {payload['model']} at {payload['url']}", "",
             f"`{payload['environment']['command']}`", "",
             "| point | req/s | p50 ms | p90 ms | p99 ms | p99.9 ms | errors | gen CPU |",
             "|---|---|---|---|---|---|---|---|"]
    for point in payload["points"]:
        row = csv_row(point)
        lines.append(f"| {_label(point)} | {row['throughput_per_s']:.1f} | {row['p50_ms']:.2f} "
                     f"| {row['p90_ms']:.2f} | {row['p99_ms']:.2f} | {row['p99.9_ms']:.2f} "
                     f"| {row['errors']} | {row['generator_cpu_fraction']:.0%} |")
    warnings = [w for p in payload["points"] for w in p.get("warnings", [])]
    if warnings:
        lines += ["", "**Warnings**", *(f"- {w}" for w in warnings)]
    lines.append("")
    lines += [f"![{name}]({name})" for name in plots]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def plot_slo_probes(path: Path, probes_by_series: dict[str, list[Probe]], *, slo_s: float,
                    limit_per_s: float | None = None, max_error_fraction: float = 0.01,
                    title: str = "SLO search") -> str:
    """Every run of an SLO search: p99 of successful requests against the offered rate, one
    series per policy (or server); runs over the error threshold are drawn as crosses."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for index, (name, probes) in enumerate(probes_by_series.items()):
        color = f"C{index}"
        ordered = sorted(probes, key=lambda p: p.rate_per_s)
        ok = [p for p in ordered if p.error_fraction <= max_error_fraction]
        erring = [p for p in ordered if p.error_fraction > max_error_fraction]
        ax.plot([p.rate_per_s for p in ok], [p.p99_s * 1e3 for p in ok], "o", color=color,
                label=name, markersize=4)
        if erring:
            ax.plot([p.rate_per_s for p in erring], [p.p99_s * 1e3 for p in erring], "x",
                    color=color, markersize=5)
    ax.axhline(slo_s * 1e3, color="k", linestyle="--", linewidth=1, label="SLO")
    if limit_per_s:
        ax.axvline(limit_per_s, color="grey", linestyle=":", linewidth=1,
                   label="computed limit")
    ax.set_xlabel("offered rate (req/s)")
    ax.set_ylabel("p99 of successful requests (ms)")
    ax.set_yscale("log")
    ax.set_title(f"{title} (x: errors over {max_error_fraction:.0%})")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, path)
