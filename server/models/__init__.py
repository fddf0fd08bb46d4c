"""Model definitions: built-in models, user factories, TorchScript files."""

from evenflow.server.models.spec import ModelDefinition, SimProfile, TensorSpec

__all__ = ["ModelDefinition", "SimProfile", "TensorSpec"]
