"""The speculators format vLLM serves: config.json (`speculators_config`, the verifier named)
and model.safetensors with Eagle3DraftModel's tensor names; read back for `eval --draft`.

Tensors are stored in bfloat16 (the dtype the engine runs the draft in), sorted by name with
fixed metadata, so the same draft writes the same bytes. `embed_tokens` and `lm_head` are
the target's (the lm_head's rows of the draft vocabulary), `d2t` / `t2d` the vocabulary
mapping when the draft vocabulary is smaller.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from tfcompile.draft.config import shape_of
from tfcompile.draft.eagle3 import DraftShape, Eagle3Draft
from tfcompile.errors import UserError
from tfcompile.io.atomic import write_atomic
from tfcompile.io.bounded import load_json
from tfcompile.io.jsonfile import write_json

WEIGHTS = "model.safetensors"
SPECULATORS_VERSION = "0.9.0"  # the speculators release whose config schema this writes


def layer_config(target_cfg: dict) -> dict:
    """The draft's transformer_layer_config: the target's config, one layer, no quantization."""
    drop = ("quantization_config", "architectures", "auto_map", "transformers_version", "_name_or_path")
    out = {k: v for k, v in target_cfg.items() if k not in drop}
    out["num_hidden_layers"] = 1
    return out


def speculators_config(target_cfg: dict, shape: DraftShape, *, verifier: str, speculative_tokens: int) -> dict:
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer_config(target_cfg),
        "draft_vocab_size": shape.draft_vocab,
        "norm_before_residual": False,
        "target_hidden_size": None,
        "eagle_aux_hidden_state_layer_ids": list(shape.aux_layers),
        "dtype": "bfloat16",
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier,
                         "architectures": list(target_cfg.get("architectures") or [])},
        },
    }


def write_draft(out: Path, draft: Eagle3Draft, config: dict) -> dict[str, str]:
    """config.json + model.safetensors into directory `out`; returns {file: sha256}."""
    state = {}
    for name, t in sorted(draft.state_dict().items()):
        t = t.detach().cpu()
        state[name] = t.to(torch.bfloat16).contiguous() if t.is_floating_point() else t.contiguous()
    data = save(state, metadata={"format": "pt"})
    write_atomic(out / WEIGHTS, data)
    return {"config.json": write_json(out / "config.json", config, atomic=True),
            WEIGHTS: hashlib.sha256(data).hexdigest()}


def read_config(path: Path) -> dict:
    f = Path(path) / "config.json"
    if not f.is_file():
        raise UserError(f"--draft {path}: no config.json", hint="pass a directory written by `tfcompile draft`")
    cfg = load_json(f, "--draft config.json", hint="pass a directory written by `tfcompile draft`")
    if not isinstance(cfg, dict) or cfg.get("speculators_model_type") != "eagle3":
        raise UserError(f"--draft {path}: not an EAGLE-3 speculators draft "
                        f"(speculators_model_type {cfg.get('speculators_model_type') if isinstance(cfg, dict) else None!r})",
                        hint="pass a directory written by `tfcompile draft` (speculators format, eagle3)")
    return cfg


def load_draft(path: Path) -> Eagle3Draft:
    """The draft of a speculators EAGLE-3 directory, in float32 (safetensors only, no pickle)."""
    cfg = read_config(path)
    tl = cfg["transformer_layer_config"]
    shape = shape_of(tl, int(cfg["draft_vocab_size"]), tuple(cfg["eagle_aux_hidden_state_layer_ids"]))
    draft = Eagle3Draft(shape)
    state = load_file(str(Path(path) / WEIGHTS))
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    missing, extra = draft.load_state_dict(state, strict=False)
    if missing or extra:
        raise UserError(f"--draft {path}: tensors {'missing ' + str(missing[:3]) if missing else ''}"
                        f"{' unexpected ' + str(extra[:3]) if extra else ''}",
                        hint="the draft's weights do not match its config.json; rewrite it with `tfcompile draft`")
    return draft.eval()
