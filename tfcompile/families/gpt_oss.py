"""GPT-OSS's family rules: its routed experts are stored fused, transposed and interleaved, with biases."""

from __future__ import annotations

from tfcompile.families.family import ExpertLayout, Family

EXPERTS = ExpertLayout("gpt_oss", transposed=True, interleaved=True, bias=True)
GPT_OSS = Family("gpt_oss", ("gpt_oss",), experts=EXPERTS, modelopt=True)
