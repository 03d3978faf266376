"""GLM's family rules: GLM-4.5 (glm4_moe: the generic MoE rules) and GLM-5 (glm_moe_dsa: MLA and
the DSA indexer, as DeepSeek-V3.2; vLLM serves it with deepseek_v2.py)."""

from __future__ import annotations

from tfcompile.families.deepseek import DSA_INDEXER, MLA_FUSE, MLA_KV_B
from tfcompile.families.family import Family

GLM_MOE_DSA = Family("glm_moe_dsa", ("glm_moe_dsa",), keep=(MLA_KV_B, DSA_INDEXER), fuse=MLA_FUSE)
GLM4_MOE = Family("glm4_moe", ("glm4_moe",))
