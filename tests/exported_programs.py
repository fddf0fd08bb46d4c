"""torch.export programs the tests export themselves (no file comes from anywhere else)."""

from __future__ import annotations

from pathlib import Path

import torch


class TwoHeads(torch.nn.Module):
    """Two inputs (FP32 features, INT64 ids), a dict of two outputs."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(8, 4)
        self.embed = torch.nn.Embedding(16, 4)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        hidden = torch.nn.functional.gelu(self.proj(x)) + self.embed(ids).sum(1)
        return {"score": hidden, "norm": hidden.norm(dim=1, keepdim=True)}


def export_two_heads(path: Path, *, dynamic_batch: bool = True) -> torch.nn.Module:
    """Export TwoHeads to ``path``; returns the eager module it was exported from."""
    module = TwoHeads().eval()
    example = (torch.ones(2, 8), torch.zeros(2, 3, dtype=torch.int64))
    batch = torch.export.Dim("batch", max=1024)
    dynamic = {"x": {0: batch}, "ids": {0: batch}} if dynamic_batch else None
    torch.export.save(torch.export.export(module, example, dynamic_shapes=dynamic), str(path))
    return module


class WithPositions(torch.nn.Module):
    """Adds each column's position, made on the input's device: exported on a CPU, the graph's
    ``arange`` node records ``device=cpu``, which moving the parameters does not change."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + torch.arange(x.shape[1], device=x.device, dtype=x.dtype)


def export_with_positions(path: Path) -> torch.nn.Module:
    """Export WithPositions (on the CPU) to ``path``; returns the eager module."""
    module = WithPositions().eval()
    batch = torch.export.Dim("batch", max=1024)
    program = torch.export.export(module, (torch.ones(2, 8),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, str(path))
    return module
