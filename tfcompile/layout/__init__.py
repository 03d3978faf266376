"""KV-layout transforms: attention weights and the KV cache arranged the way a target engine reads them.

- engines.py: what each engine's attention backend accepts (one table, with sources)
- heads.py: head geometry, RoPE row order (half-split <-> interleaved), TP head grouping
- plan.py: the layout plan (which rows of which members make each view Linear)
- view.py: the engine view OUT/<target>/ streamed by pack
- descriptor.py: OUT/tfcompile/kv_cache.json
- paged_attention.py, reference.py: a torch paged attention and decoder that read the view
  (the check that every transform preserves the model's outputs)
The pass is passes/layout.py; docs/formats.md "KV-cache descriptor" and "Engine views".
"""
