"""`plan --estimate` with the distill pass: its element counts, from config.json and the plan alone,
are the built student's and teacher's (tfcompile/distill/fsdp.py counts them from the modules the
run trains); and Llama-3.1-8B, which DDP cannot distill on an 80 GB H100, fits under FSDP2 on 8."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tfcompile.distill.config import DistillConfig
from tfcompile.distill.fsdp import counts as built_counts
from tfcompile.estimate.distill import counts as estimated_counts
from tfcompile.recipe.build import build_recipe

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo-lm"


@pytest.mark.parametrize("cfg", [DistillConfig(), DistillConfig(train_unquantized=True),
                                 DistillConfig(train="scales"), DistillConfig(train="lora", lora_rank=4),
                                 DistillConfig(teacher="cache", heldout_tokens=0, optimizer="sgd")],
                         ids=["weights", "unquantized", "scales", "lora", "cache-sgd"])
def test_counts_from_the_config_are_the_built_models(cfg):
    from tfcompile import api  # noqa: F401 - registers the passes the estimate runs
    from tfcompile.calibration.forward import load_hf_model
    from tfcompile.calibration.binding import skeleton
    from tfcompile.distill.student import build_student
    from tfcompile.estimate.plan import _program
    from tfcompile.estimate.shapes import model_shape

    shape = model_shape(DEMO)
    program, plan = _program(shape, build_recipe(fmt="nvfp4a16"))
    student = build_student(load_hf_model(DEMO, torch.float32), plan, program, train=cfg.train,
                            lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha, seed=0, dtype=torch.bfloat16)
    if cfg.train_unquantized:
        student.train_unquantized(set(plan.passthrough), torch.bfloat16)
    teacher = load_hf_model(DEMO, torch.float32)
    assert estimated_counts(shape, plan, cfg) == built_counts(student, teacher, cfg)
    # what `auto` decides by under torchrun: both models built on the meta device (no weight read)
    meta = build_student(skeleton(DEMO), plan, program, train=cfg.train, lora_rank=cfg.lora_rank,
                         lora_alpha=cfg.lora_alpha, seed=0, dtype=torch.bfloat16)
    if cfg.train_unquantized:
        meta.train_unquantized(set(plan.passthrough), torch.bfloat16)
    assert built_counts(meta, skeleton(DEMO), cfg) == built_counts(student, teacher, cfg)


def test_llama_8b_needs_fsdp_on_h100(run_cli):
    cfg = ROOT / "examples" / "configs" / "llama-3.1-8b"
    args = ["--format", "nvfp4a16", "--set", "distill.steps=1", "--estimate", "--json"]
    one, eight = (run_cli("plan", cfg, *args, "--devices", d) for d in ("1xH100", "8xH100"))
    assert one.code == 0 and eight.code == 0, one.err + eight.err
    a, b = one.json()["passes"]["distill"], eight.json()["passes"]["distill"]
    # float32 weights + gradients + 2 AdamW states of the Linears, the frozen rest, the teacher
    assert a["sharding"] is None and a["device_gb"] > 80 and not one.json()["memory"]["fits"]["device"]
    assert b["sharding"] == "fsdp" and b["ddp_gb_per_rank"] > 80 > b["fsdp_gb_per_rank"] == b["device_gb"]
    assert eight.json()["memory"]["fits"]["device"]
