"""Run an artifact's quantized Linears with its own kernels (CUDA) or their torch emulation (CPU).

`load_artifact(path, device)` -> LoadedArtifact with one QuantLinear per quantized module;
`LoadedArtifact.install(model)` swaps them into a model built from the artifact's config.json.
"""

from tfcompile.runtime.linear import QuantLinear
from tfcompile.runtime.loader import BACKENDS, LoadedArtifact, load_artifact

__all__ = ["BACKENDS", "LoadedArtifact", "QuantLinear", "load_artifact"]
