"""Linear shapes a config.json implies, from transformers on the meta device.

Instantiating the architecture on the meta device allocates nothing and runs
no checkpoint code (trust_remote_code stays off), and gives the exact
(out_features, in_features) of every nn.Linear the loader will create.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from torch import nn


def expected_linear_shapes(config_path: Path) -> dict[str, tuple[int, int]] | None:
    """{module name: (N, K)} for the architecture in config.json; None if unknown."""
    try:
        import transformers  # lazy: transformers (~2 s to import); only `tfcompile verify` builds the model
    except ImportError:
        return None
    cfg_dict = json.loads(Path(config_path).read_text())
    cfg_dict.pop("quantization_config", None)
    arch = (cfg_dict.get("architectures") or [None])[0]
    cls = getattr(transformers, arch, None) if arch else None
    if cls is None:
        return None
    try:
        config = transformers.AutoConfig.for_model(**cfg_dict)
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            model = cls(config)
    except Exception:  # noqa: BLE001 - an architecture we cannot build: skip the check
        return None
    return {name: (m.out_features, m.in_features)
            for name, m in model.named_modules() if isinstance(m, nn.Linear)}
