"""Quantization-aware distillation (`tfcompile distill`, the `distill` pass).

- config.py     DistillConfig: every `distill.*` setting
- fakequant.py  straight-through fake quantization by pack's own format rules
- student.py    the fake-quantized student; what trains (weights, scales, LoRA)
- data.py       training / held-out tokens through the calibration loaders
- teacher.py    teacher targets: online, or top-k logits cached on disk
- loss.py       KL at a temperature, cross-entropy, hidden-state MSE
- train.py      optimizer, schedule, accumulation, checkpoints, Ctrl-C, progress
- checkpoint.py --resume-dir: state, metrics.jsonl, run fingerprint
- layerwise.py  block-wise distillation (teacher layer outputs as targets)
- heldout.py    before/after figures, as tfcompile eval computes them
- ddp.py        under torchrun: the data split, DDP, the per-step agreements
- fsdp.py       under torchrun: the student (and teacher) sharded with FSDP2; whole-tensor checkpoints
- memory.py     memory per rank, DDP vs FSDP2 (`distill.sharding auto`, plan --estimate)
- run.py        one run, end to end; called by passes/distill.py
Design and figures: docs/design.md "Distillation", docs/accuracy.md.
"""
