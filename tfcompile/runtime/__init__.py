"""Run an artifact's quantized Linears with its own kernels (CUDA) or their torch emulation (CPU).

`load_artifact(path, device)` -> LoadedArtifact with one QuantLinear per quantized module;
`LoadedArtifact.install(model)` swaps them into a model built from the artifact's config.json.
"""

from tfcompile.runtime.linear import Kernels, QuantLinear
from tfcompile.runtime.loader import LoadedArtifact, load_artifact

__all__ = ["Kernels", "LoadedArtifact", "QuantLinear", "load_artifact"]
