"""Mixed precision: per-group formats chosen under a budget from measured sensitivity.

sensitivity.py measures each fusion group's cost (KL of the model's output when that group alone
is quantized); search.py picks a format per group under an average-bits or KL budget; config.py
writes the compressed-tensors config groups (one per format, explicit module targets) and
checks them back; passes/mixed.py is the pass.
"""
