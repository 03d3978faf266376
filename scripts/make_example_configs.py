"""Write the config.json files `tfcompile plan --estimate` is shown on (no download, no weights):

- examples/configs/deepseek-v3: transformers' DeepseekV3Config() defaults, which are
  DeepSeek-V3's published 671B shape (61 layers, hidden 7168, MLA with q_lora_rank 1536 and
  kv_lora_rank 512, 256 routed experts of 2048 + 1 shared, 8 per token, first 3 layers dense),
  plus the published checkpoint's FP8 block-128 `quantization_config` (the source format);
- examples/configs/llama-3.1-8b and llama-3.1-405b: LlamaConfig with Meta's published numbers
  (Llama 3.1 model card / config.json: hidden, intermediate, layers, heads, KV heads, vocab,
  RoPE theta 500000 with llama3 scaling, 131072 positions, bf16).

    python scripts/make_example_configs.py
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "examples" / "configs"
LLAMA_31 = dict(vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                bos_token_id=128000, eos_token_id=128001, tie_word_embeddings=False,
                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
LLAMA = {
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8),
    "llama-3.1-405b": dict(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126,
                           num_attention_heads=128, num_key_value_heads=8),
}
# DeepSeek-V3's published checkpoint: FP8 E4M3 weights with one fp32 scale per 128x128 block
DEEPSEEK_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [128, 128]}


def _write(name: str, cfg) -> Path:
    d = OUT / name
    d.mkdir(parents=True, exist_ok=True)
    doc = cfg.to_dict()
    doc.pop("transformers_version", None)  # no machine-specific fields: the file is committed
    (d / "config.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return d


def main() -> None:
    from transformers import DeepseekV3Config, LlamaConfig

    ds = DeepseekV3Config(architectures=["DeepseekV3ForCausalLM"], dtype="bfloat16")
    ds.quantization_config = DEEPSEEK_FP8
    print(_write("deepseek-v3", ds))
    for name, shape in LLAMA.items():
        print(_write(name, LlamaConfig(architectures=["LlamaForCausalLM"], dtype="bfloat16", **shape, **LLAMA_31)))


if __name__ == "__main__":
    main()
