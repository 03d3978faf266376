"""Helpers for tests/engines: run vLLM (in its own venv, through tests/engines/vllm_driver.py) on an
artifact, and compare what it built with what tfcompile's manifest says.

The expectations here are vLLM's own class names and attributes, read from its source
(site-packages/vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py,
`_get_scheme_from_parts`), not from tfcompile: the manifest says which format a module has, vLLM
says which scheme it serves it with.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("vllm_driver.py")

_MXFP4_DYNAMIC = "QuantKey(u8,scale(u8,dynamic,GroupShape(row=1, col=32)),symmetric)"  # vLLM's kMxfp4Dynamic
# manifest format -> (vLLM scheme class, attributes of the scheme object it must have)
EXPECTED = {
    "nvfp4": ("CompressedTensorsW4A4Fp4", {"a16": False}),
    "nvfp4a16": ("CompressedTensorsW4A4Fp4", {"a16": True}),
    "mxfp4": ("CompressedTensorsW4A4Mxfp4", {"kernel_args": {"activation_quant_key": _MXFP4_DYNAMIC}}),
    # weight-only: no activation quantization asked of the kernel (vLLM 0.32 asks for W4A4: #56770)
    "mxfp4a16": ("CompressedTensorsW4A4Mxfp4", {"kernel_args": {"activation_quant_key": "None"}}),
    "mxfp8": ("CompressedTensorsW8A8Mxfp8", {}),
    "fp8": ("CompressedTensorsW8A8Fp8", {"static_input": True, "strategy": "tensor"}),
    "fp8-dynamic": ("CompressedTensorsW8A8Fp8", {"static_input": False, "strategy": "channel"}),
    "fp8-block": ("CompressedTensorsW8A8Fp8", {"static_input": False, "strategy": "block"}),
}
# checkpoint dtype -> parameter dtype casts vLLM's loaders may do without changing a value
LOSSLESS = {("bfloat16", "float32"), ("float16", "float32")}
_EXPERT = re.compile(r"\.experts\.\d+\.(gate_proj|up_proj|down_proj|w1|w2|w3)$")  # w*: MiniMax-M2


def vllm_python() -> str:
    """$TFCOMPILE_VLLM_PYTHON, else the venv scripts/vllm_env.sh creates or reuses (its stdout)."""
    py = os.environ.get("TFCOMPILE_VLLM_PYTHON")
    if py:
        return py
    r = subprocess.run(["bash", str(ROOT / "scripts" / "vllm_env.sh")], capture_output=True, text=True)
    assert r.returncode == 0, f"scripts/vllm_env.sh failed (exit {r.returncode}):\n{r.stderr[-3000:]}"
    return r.stdout.strip().splitlines()[-1]


def run_driver(py: str, *args, timeout: int = 1200):
    """The driver's JSON (its stdout); its log (vLLM's) is kept for the failure message."""
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="2")
    env.pop("PYTHONPATH", None)
    r = subprocess.run([py, str(DRIVER), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       env=env, cwd=str(DRIVER.parent))
    assert r.returncode == 0 and r.stdout.strip(), f"vllm_driver {args[0]}: exit {r.returncode}\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def vllm_module(module: str, packed: dict[str, list[str]]) -> str:
    """The vLLM module that serves checkpoint Linear `module` (fused groups: packed_modules_mapping)."""
    if _EXPERT.search(module):
        return _EXPERT.sub(".experts.routed_experts", module)
    parent, leaf = module.rsplit(".", 1)
    for fused, members in packed.items():
        if leaf in members:
            return f"{parent}.{fused}"
    return module


def scheme_problems(rep: dict, manifest: dict) -> list[str]:
    """Every Linear: the scheme vLLM chose against the format the manifest says; nothing else quantized."""
    bad, packed, served = [], rep["packed_modules_mapping"], {}
    for layer in manifest["layers"]:
        fmt = layer.get("format") or manifest["scheme"]["name"]
        module = rep.get("hf_to_vllm", {}).get(layer["module"], layer["module"])  # vLLM's own renaming
        served.setdefault(vllm_module(module, packed), set()).add(fmt)
    for name, fmts in sorted(served.items()):
        if len(fmts) > 1:
            bad.append(f"{name}: one fused vLLM layer, several formats {sorted(fmts)}")
            continue
        fmt = next(iter(fmts))
        if name.endswith(".routed_experts"):
            method = rep["experts"].get(name)
            if method is None or not method.startswith("CompressedTensors"):
                bad.append(f"{name}: experts served by {method}, expected a compressed-tensors MoE method")
            continue
        lin = rep["linears"].get(name)
        if lin is None:
            bad.append(f"{name}: no such vLLM Linear (manifest {fmt})")
            continue
        cls, attrs = EXPECTED[fmt]
        if lin["scheme"] != cls:
            bad.append(f"{name}: vLLM scheme {lin['scheme']}, manifest {fmt} -> {cls}")
        for k, v in attrs.items():
            got = lin.get(k)
            if isinstance(v, dict):
                got = {kk: (got or {}).get(kk) for kk in v}
            if got != v:
                bad.append(f"{name}: {k} = {got}, manifest {fmt} -> {v}")
    for name, lin in sorted(rep["linears"].items()):
        if lin["scheme"] is not None and name not in served:
            bad.append(f"{name}: quantized by vLLM ({lin['scheme']}) but kept by tfcompile")
    for name, method in sorted(rep["experts"].items()):
        if name not in served and "Unquantized" not in method:
            bad.append(f"{name}: experts quantized by vLLM ({method}) but kept by tfcompile")
    return bad


def loader_problems(rep: dict) -> list[str]:
    """Every checkpoint tensor went through a vLLM weight loader, into a parameter of its dtype."""
    used = {c["tensor"] for c in rep["calls"]}
    bad = [f"{t['name']}: read by no weight loader" for t in rep["tensors"] if t["name"] not in used]
    for c in rep["calls"]:
        if c["dtype"] != c["param_dtype"] and (c["dtype"], c["param_dtype"]) not in LOSSLESS:
            bad.append(f"{c['tensor']}: {c['dtype']} {c['shape']} loaded into {c['param']} ({c['param_dtype']})")
    return bad


def kv_problems(rep: dict, manifest: dict, artifact: Path) -> list[str]:
    """--kv-cache fp8: vLLM's attention layers use an fp8 cache with the artifact's k/v scales."""
    from safetensors import safe_open

    kv = manifest["scheme"].get("kv_cache")
    if not kv:
        return [f"{n}: kv_cache_dtype {a['kv_cache_dtype']}, no KV scheme in the artifact"
                for n, a in rep["attention"].items() if a["kv_cache_dtype"] != "auto"]
    scales = {}
    for f in sorted(Path(artifact).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            scales.update({k: float(st.get_tensor(k).float()) for k in st.keys() if k.endswith(("k_scale", "v_scale"))})
    bad = []
    for module in manifest["kv_modules"]:
        a = rep["attention"].get(f"{module}.attn")
        if a is None:
            bad.append(f"{module}.attn: no vLLM attention layer")
            continue
        if not a["kv_cache_dtype"].startswith("fp8"):
            bad.append(f"{module}.attn: kv_cache_dtype {a['kv_cache_dtype']}")
        for k in ("k_scale", "v_scale"):
            if a[k] != scales[f"{module}.{k}"]:
                bad.append(f"{module}.attn: {k} {a[k]} served, {scales[f'{module}.{k}']} written")
    return bad
