"""Built-in models. Weights come from a fixed seed, never from a hub."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evenflow.server.models.sim import SleepIdentity
from evenflow.server.models.spec import ModelDefinition, SimProfile, TensorSpec

MLP_WIDTH = 256


def build_mlp() -> ModelDefinition:
    """The reference model: 256 -> 1024 -> 1024 -> 1024 -> 256 with GELUs, float32."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(MLP_WIDTH, 1024), torch.nn.GELU(),
        torch.nn.Linear(1024, 1024), torch.nn.GELU(),
        torch.nn.Linear(1024, 1024), torch.nn.GELU(),
        torch.nn.Linear(1024, MLP_WIDTH),
    ).eval()
    return ModelDefinition(module=module,
                           inputs=[TensorSpec("x", "FP32", (-1, MLP_WIDTH))],
                           outputs=[TensorSpec("y", "FP32", (-1, MLP_WIDTH))])


@dataclass(frozen=True, slots=True)
class EncoderSize:
    """Transformer encoder dimensions: ``small`` suits a CPU; ``bert-base`` is BERT-base."""

    layers: int
    width: int
    heads: int
    seq: int

    @property
    def ffn(self) -> int:
        return 4 * self.width


ENCODER_SIZES = {
    "small": EncoderSize(layers=2, width=64, heads=4, seq=16),
    "bert-base": EncoderSize(layers=12, width=768, heads=12, seq=128),
}


def build_encoder(size: EncoderSize = ENCODER_SIZES["small"]) -> ModelDefinition:
    """A post-norm transformer encoder over already-embedded tokens.

    Input ``x`` FP32 ``[-1, seq, width]`` (embeddings, so no vocabulary is needed); output ``y``
    FP32 of the same shape.
    """
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        d_model=size.width, nhead=size.heads, dim_feedforward=size.ffn, dropout=0.0,
        activation="gelu", batch_first=True)
    module = torch.nn.TransformerEncoder(layer, num_layers=size.layers,
                                         enable_nested_tensor=False).eval()
    shape = (-1, size.seq, size.width)
    return ModelDefinition(module=module, inputs=[TensorSpec("x", "FP32", shape)],
                           outputs=[TensorSpec("y", "FP32", shape)])


DEFAULT_SIM_LAYER_MS = (2.0, 6.0, 3.0, 1.0, 4.0, 8.0, 2.0, 5.0)


def build_sim_layers(layer_ms: tuple[float, ...] = DEFAULT_SIM_LAYER_MS) -> ModelDefinition:
    """``simlayers``: a chain of identity layers, layer j costing ``layer_ms[j] * (1 + b/10)``
    ms of sleep at batch b on a speed-1 device: a pipelined model whose layer costs are known,
    so pipelines can be tested and measured on any machine."""
    layers = [SleepIdentity(SimProfile(ms, ms / 10.0)) for ms in layer_ms]
    return ModelDefinition(module=torch.nn.Sequential(*layers),
                           inputs=[TensorSpec("x", "FP32", (-1, MLP_WIDTH))],
                           outputs=[TensorSpec("y", "FP32", (-1, MLP_WIDTH))],
                           sim_profile=SimProfile(sum(layer_ms), sum(layer_ms) / 10.0),
                           traceable=False)


def build_sim(profile: SimProfile) -> ModelDefinition:
    """Output equals input ``x`` FP32 ``[-1, 256]``; each batch costs ``profile`` (sleeping)."""
    return ModelDefinition(module=SleepIdentity(profile),
                           inputs=[TensorSpec("x", "FP32", (-1, MLP_WIDTH))],
                           outputs=[TensorSpec("y", "FP32", (-1, MLP_WIDTH))],
                           sim_profile=profile, traceable=False)
