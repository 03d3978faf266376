"""Run in the vLLM venv (tests/engines/test_vllm_online_transform.py): what vLLM 0.32 makes of an artifact's
`transform_config`, without building the model. Prints one JSON line: per checkpoint Linear, the online input
transform vLLM's compressed-tensors config gives its (fused) layer (`get_linear_transform_schemes`, the call
`CompressedTensorsConfig.get_quant_method` makes for every LinearBase), and whether this vLLM build has the
hadacore kernel its `HadamardTransform.forward` runs for `type: "hadamard"` (transform/module.py)."""

import json
import sys
from pathlib import Path

import torch
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
from vllm.model_executor.layers.quantization.compressed_tensors.transform.linear import get_linear_transform_schemes
from vllm.model_executor.models.llama import LlamaForCausalLM

import vllm._custom_ops  # noqa: F401  (registers torch.ops._C where the build has it)

art = Path(sys.argv[1])
qc = json.loads((art / "config.json").read_text())["quantization_config"]
cfg = CompressedTensorsConfig.from_config(qc)
packed = LlamaForCausalLM.packed_modules_mapping
kinds = {"qkv_proj": QKVParallelLinear, "o_proj": RowParallelLinear, "gate_up_proj": MergedColumnParallelLinear,
         "down_proj": RowParallelLinear}
out = {}
layers = {f"model.layers.{i}" for i in range(int(json.loads((art / "config.json").read_text())["num_hidden_layers"]))}
for prefix in sorted(layers):
    for fused, cls in kinds.items():
        sub = "self_attn" if fused in ("qkv_proj", "o_proj") else "mlp"
        name = f"{prefix}.{sub}.{fused}"
        layer = cls.__new__(cls)  # the class is what the match reads (compressed_tensors is_match: LinearBase)
        torch.nn.Module.__init__(layer)
        inputs, outputs = get_linear_transform_schemes(layer, name, cfg.transform_config, packed)
        out[name] = {"inputs": {str(i): {"type": t.scheme.type, "head_dim": t.scheme.head_dim,
                                         "location": str(t.args.location), "randomize": t.scheme.randomize}
                                for i, t in inputs.items()}, "outputs": len(outputs)}
print(json.dumps({"layers": out, "hadacore": hasattr(torch.ops._C, "hadacore_transform")}))
