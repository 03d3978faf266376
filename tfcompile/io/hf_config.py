"""transformers' config object for a checkpoint directory, never running its code.

`AutoConfig.from_pretrained` raises ValueError for a model type it does not know and for a
config.json whose `auto_map` names custom code (tfcompile never passes trust_remote_code), and
other errors for values it cannot use. Those are facts about the input: `load_hf_config` turns
them into a CheckpointError (exit 1) naming config.json, for every pass and command that builds
the model (calibration, evaluation, decoding a published checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfcompile.errors import CheckpointError


# Published architecture names (a checkpoint's own remote code) of models transformers implements natively
# under another class name that reads the published tensor names (its conversion mapping). Kimi K2.5:
# Moonshot's config.json and vLLM 0.32's model registry say KimiK25ForConditionalGeneration, transformers
# 5.25's class is Kimi_K25ForConditionalGeneration (tests/families/test_kimi_k25.py).
ARCH_ALIASES = {"KimiK25ForConditionalGeneration": "Kimi_K25ForConditionalGeneration"}


def transformers_class(arch) -> Any:
    """transformers' class for config.json's architecture `arch` (its own name, else its native alias), or None."""
    # lazy: transformers (~2 s to import); only where a model is built
    import transformers

    if not isinstance(arch, str):
        return None
    return getattr(transformers, arch, None) or getattr(transformers, ARCH_ALIASES.get(arch, ""), None)


def load_hf_config(model_dir: str | Path) -> Any:
    """`transformers.AutoConfig.from_pretrained(model_dir)` without remote code; CheckpointError
    naming MODEL/config.json when transformers cannot build a config from it."""
    # lazy: transformers (~2 s to import); only where a model is built
    import transformers

    try:
        return transformers.AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    except (ValueError, KeyError, TypeError, OSError) as e:
        msg = " ".join(str(e).split())
        custom = "trust_remote_code" in msg or "custom code" in msg
        why = ("its architecture is not in transformers and auto_map names custom code, which tfcompile never "
               "runs" if custom else f"transformers {transformers.__version__} cannot read it ({msg[:200]})")
        raise CheckpointError(f"{Path(model_dir) / 'config.json'}: {why}",
                              hint="this needs a model transformers has (its own code); weight-only RTN formats "
                                   "quantize an unknown one with --allow-unknown-architecture" if custom else
                                   "fix or re-download config.json") from None


__all__ = ["ARCH_ALIASES", "load_hf_config", "transformers_class"]
