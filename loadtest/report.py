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
    import aiohttp
    import grpc

    return {"command": " ".join(sys.argv), "python": platform.python_version(),
            "grpcio": grpc.__version__, "aiohttp": aiohttp.__version__, "cores": os.cpu_count(),
            "platform": platform.platform()}


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
    """A point by what it is: a concurrency, an offered rate, or a scenario's name."""
    if point["mode"] == "scenario":
        return f"scenario: {point.get('scenario', '?')}"
    if point["mode"] == "concurrency":
        return f"{point['value']:g} conc"
    return f"{point['value']:.1f} req/s offered"


def _mark_events(ax: Any, events: list[tuple[float, str]]) -> None:
    """Vertical lines at a scenario's events (load changes, bursts, slow-downs), labelled."""
    for t_s, what in events:
        ax.axvline(t_s, color="grey", linestyle=":", linewidth=1)
        ax.annotate(what, (t_s, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                    fontsize=6, va="top", ha="right", color="dimgrey")


def _plot_over_time(out: Path, point: dict[str, Any]) -> str:
    """Throughput and p99 over a scenario's time line, its events marked."""
    bin_s = point.get("throughput_series_bin_s", 0.25)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    series = point.get("throughput_series", [])
    top.plot([(i + 0.5) * bin_s for i in range(len(series))], series, "-")
    top.set_ylabel("successes/s")
    top.set_title(f"{_label(point)}: throughput and p99 over time")
    p99_points = [((i + 0.5) * bin_s, v) for i, v in enumerate(point.get("p99_series_ms", []))
                  if v is not None]
    if p99_points:
        bottom.plot(*zip(*p99_points, strict=True), ".-", markersize=3)
    bottom.set_ylabel("p99 (ms), by send time")
    bottom.set_xlabel("time since start (s)")
    for ax in (top, bottom):
        _mark_events(ax, point.get("events", []))
        ax.grid(alpha=0.3)
    return _save(fig, out / "over_time.png")


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

    for point in points:
        if point["mode"] == "scenario":
            drawn.append(_plot_over_time(out, point))
    search = payload.get("slo_search")
    if search:
        probes = [Probe(p["rate_per_s"], p["seed"], p["p50_ms"] / 1e3, p["p99_ms"] / 1e3,
                        p["error_fraction"], p["throughput_per_s"]) for p in search["probes"]]
        drawn.append(plot_slo_probes(out / "slo_search.png", {payload["model"]: probes},
                                     slo_s=search["slo_ms"] / 1e3,
                                     max_error_fraction=search["max_error_fraction"],
                                     title=f"SLO goodput {search['goodput_per_s']:.1f} req/s"))
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
            if len(points) == 1:
                _mark_events(ax, points[0].get("events", []))
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
    protocol = {"grpc": "gRPC", "http": "HTTP/REST"}.get(payload.get("protocol", "grpc"), "?")
    lines = [f"# Load test: {payload['model']} at {payload['url']} over {protocol}", "",
             f"`{payload['environment']['command']}`", ""]
    search = payload.get("slo_search")
    if search:
        lines += [f"**SLO goodput: {search['goodput_per_s']:.1f} req/s** (p99 of successful "
                  f"requests <= {search['slo_ms']:g} ms, errors <= "
                  f"{search['max_error_fraction']:.1%}; range {search['low_per_s']:.1f}-"
                  f"{search['high_per_s']:.1f} req/s over {len(search['probes'])} runs, "
                  "each below)", ""]
    lines += ["| point | req/s | p50 ms | p90 ms | p99 ms | p99.9 ms | errors | gen CPU |",
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
