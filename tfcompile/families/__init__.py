"""Model families: per-family quantization rules, fused-expert layouts, name maps, attention kinds.

Imported by passes (select, layout), calibration and evaluate; imports nothing from them.
docs/models.md is the user-facing table of these rules.
"""

from tfcompile.families.family import V5, ExpertLayout, Family, Keep
from tfcompile.families.gpt_oss import EXPERTS as GPT_OSS
from tfcompile.families.rules import (FAMILIES, GENERIC, engine_unquantized, families, family_of, includes, keep_rules,
                                      register_family, unregister_family)

__all__ = ["FAMILIES", "GENERIC", "GPT_OSS", "V5", "ExpertLayout", "Family", "Keep", "engine_unquantized", "families",
           "family_of", "includes", "keep_rules", "register_family", "unregister_family"]
