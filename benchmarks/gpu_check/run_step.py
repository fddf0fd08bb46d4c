"""One step in its own process: ``python -m benchmarks.gpu_check.run_step NAME --out DIR``.

Writes ``DIR/result.json``: ``{"status": "ran", "results": ...}`` or ``{"status": "failed",
"error": ...}`` with the traceback's tail; the parent reads it, or records the crash or timeout.
"""

from __future__ import annotations

import argparse
import json
import traceback

from benchmarks.gpu_check.context import StepContext
from benchmarks.gpu_check.steps import STEPS

RESULT_FILE = "result.json"
ERROR_TAIL_CHARS = 3000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=[s.name for s in STEPS])
    StepContext.add_arguments(parser)
    args = parser.parse_args()
    ctx = StepContext.from_args(args)
    ctx.out.mkdir(parents=True, exist_ok=True)
    step = next(s for s in STEPS if s.name == args.name)
    try:
        payload = {"status": "ran", "results": step.load()(ctx)}
    except Exception:
        payload = {"status": "failed", "error": traceback.format_exc()[-ERROR_TAIL_CHARS:]}
    (ctx.out / RESULT_FILE).write_text(json.dumps(payload, indent=2, default=str))


if __name__ == "__main__":
    main()
