"""The report: ``report.json`` (every step with its status and figures) and ``report.md``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RAN, FAILED, SKIPPED, NEEDS_CUDA = "ran", "failed", "skipped", "needs CUDA"


@dataclass
class StepResult:
    name: str
    title: str
    status: str  # RAN, FAILED, SKIPPED or NEEDS_CUDA
    seconds: float = 0.0
    reason: str = ""  # why skipped, or the error's tail when failed
    results: dict[str, Any] = field(default_factory=dict)


def write_report(out: Path, header: dict[str, Any], steps: list[StepResult]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    payload = {**header, "steps": [asdict(s) for s in steps]}
    (out / "report.json").write_text(json.dumps(payload, indent=2, default=str))
    lines = ["# evenflow GPU check", ""]
    lines += [f"- {key}: {value}" for key, value in header.items()]
    lines += ["", "| step | status | seconds | note |", "|---|---|---|---|"]
    for s in steps:
        note = s.reason.strip().splitlines()[-1] if s.reason.strip() else ""
        lines.append(f"| {s.name} | {s.status} | {s.seconds:.1f} | {note.replace('|', '/')} |")
    for s in steps:
        lines += ["", f"## {s.name}: {s.title}", "", f"status: **{s.status}**"]
        if s.reason:
            lines += ["", "```", s.reason.rstrip(), "```"]
        if s.results:
            lines += ["", "```json", json.dumps(s.results, indent=2, default=str), "```"]
    (out / "report.md").write_text("\n".join(lines) + "\n")
