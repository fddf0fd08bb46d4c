"""What a step knows about the run: where to write, which device to serve on, how many GPUs."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class StepContext:
    out: Path  # this step's own folder (server logs, its result)
    dry_run: bool
    gpus: int  # CUDA devices visible to the run

    @property
    def device(self) -> str:
        """The device the server steps serve on: cuda:0, or cpu in a dry run."""
        return "cpu" if self.dry_run else "cuda:0"

    @property
    def encoder_size(self) -> str:
        return "small" if self.dry_run else "bert-base"

    @property
    def dtypes(self) -> tuple[str, ...]:
        """Precisions to check; ``--dtype`` applies on GPUs only, so a dry run has one."""
        return ("float32",) if self.dry_run else ("float32", "bfloat16")

    def to_argv(self) -> list[str]:
        return ["--out", str(self.out), "--gpus", str(self.gpus),
                *(["--dry-run"] if self.dry_run else [])]

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--out", type=Path, required=True)
        parser.add_argument("--gpus", type=int, default=0)
        parser.add_argument("--dry-run", action="store_true")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> StepContext:
        return cls(out=args.out, dry_run=args.dry_run, gpus=args.gpus)
