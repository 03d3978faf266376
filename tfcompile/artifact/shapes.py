"""verify's config checks: the artifact against the architecture its config.json describes.

The architecture is built by transformers on the meta device
(tfcompile/checkpoint_check.py: nothing allocated, no checkpoint code run),
after config.json's values passed the range checks of tfcompile/io/config_check.py
(a billion layers is refused before anything is built). Then:
- `config`: config.json readable, its values in range;
- `shapes vs config`: every quantized layer's unpacked [N, K] equals the
  (out_features, in_features) of that nn.Linear;
- `complete vs config`: every parameter of the architecture has its tensor in
  the artifact with the right shape and a float dtype, and no tensor is left
  over; a quantized Linear counts as its `.weight` of shape [N, K], its packed
  data and scales as that weight.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tfcompile.artifact.naming import ct_outputs, layer_scheme
from tfcompile.checkpoint_check import build_meta_model, find_problems, fuse_unmapped_experts, without_mtp
from tfcompile.errors import UserError
from tfcompile.io.checkpoint import read_config


def check_against_config(path: Path, doc: dict, scheme, headers: dict, rep) -> None:
    try:
        config = read_config(Path(path))
        model = build_meta_model(config, f"{path}/config.json")
    except UserError as e:
        rep.add("config", False, e.message)
        return
    rep.add("config", True, "values in range")
    if model is None:
        for check in ("shapes vs config", "complete vs config"):
            rep.add(check, True, f"architecture {config['architectures'][0]!r} not known to transformers: skipped")
        return
    linears = {name: (m.out_features, m.in_features) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear)}
    bad, checked = [], 0
    for layer in doc.get("layers", []):
        want = linears.get(layer["module"])
        if want is None:
            continue
        checked += 1
        if tuple(layer["shape"]) != want:
            bad.append(f"{layer['module']}: {layer['shape']} vs config {list(want)}")
    rep.add("shapes vs config", not bad, "; ".join(bad[:5]) or f"{checked} layers match config.json")
    held = without_mtp(config, artifact_tensors(doc, scheme, headers))  # MTP layers: no module to judge them
    problems = find_problems(model, fuse_unmapped_experts(model, config, held))
    rep.add("complete vs config", not problems,
            problems.summary() or "every parameter of the architecture is present")


def artifact_tensors(doc: dict, scheme, headers: dict) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """The artifact's tensors as the unquantized checkpoint names them: {name: (dtype, shape)}."""
    consumed, out = set(), {}
    for layer in doc.get("layers", []):
        n, k = layer["shape"]
        specs = ct_outputs(layer_scheme(layer, scheme), layer["module"], n, k, torch.bfloat16)  # mixed: its own
        consumed.update(spec.name for spec in specs)
        out[f"{layer['module']}.weight"] = (torch.bfloat16, (n, k))
    for attn in doc.get("kv_modules", []):
        consumed.update((f"{attn}.k_scale", f"{attn}.v_scale"))
    for name, (_, dtype, shape) in headers.items():
        if name not in consumed:
            out[name] = (dtype if isinstance(dtype, torch.dtype) else torch.uint8, tuple(shape))
    return out
