"""`DistillConfig`: every setting of the `distill` pass (`--set distill.FIELD=VALUE`).

Fields marked `runtime` (where checkpoints and metrics go) change where work is
kept, not what is computed; they are left out of the recipe the manifest
records, so a resumed run and an uninterrupted one write the same artifact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tfcompile.dist.devices import check_device
from tfcompile.errors import RecipeError

TRAIN = ("weights", "scales", "lora")
MODES = ("model", "layerwise")
TEACHERS = ("online", "cache")
OPTIMIZERS = ("adamw", "adam", "sgd")
SCHEDULES = ("cosine", "linear", "constant")
SHARDINGS = ("auto", "ddp", "fsdp")  # under torchrun: replicate the student (DDP) or shard it (FSDP2)
# distill.lr = 0 picks the mode's default (measured on the demo LM, docs/accuracy.md)
DEFAULT_LR = {"weights": 1e-4, "scales": 2e-3, "lora": 1e-3}


def runtime(default):
    """A field that says where to keep work, not what to compute (not in the manifest)."""
    return field(default=default, metadata={"runtime": True})


@dataclass(frozen=True)
class DistillConfig:
    # what trains
    train: str = "weights"  # weights | scales (per-block clip of the scales) | lora (merged before pack)
    # weights: also train what the artifact keeps unquantized (norms, embeddings, untied lm_head)
    train_unquantized: bool = False
    # a tfcompile artifact of the same model and format whose dequantized weights the student starts
    # from (e.g. a GPTQ artifact; tfcompile/distill/init.py), or "gptq": `tfcompile distill` builds that
    # artifact first with this run's own settings (tfcompile/cli/distill_start.py); "" = the checkpoint's
    # own weights (RTN)
    init: str = field(default="", metadata={"omit_default": True})  # recorded only when set
    # the artifact distill.init = "gptq" was built into (set by tfcompile/cli/distill_start.py; where, not what)
    init_artifact: str = runtime("")
    lora_rank: int = 16
    lora_alpha: float = 16.0  # LoRA update scale = lora_alpha / lora_rank
    mode: str = "model"  # model: logit distillation of the whole model | layerwise: block by block
    # data (calibration/ loaders; docs/cli.md)
    data: str = "python-doc"  # python-doc | FILE | save_to_disk folder | cached data set | self | random
    seq_len: int = 256  # tokens per training block
    batch: int = 8  # blocks per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    steps: int = 200  # optimizer steps (layerwise: per decoder layer)
    layer_samples: int = 64  # layerwise: training blocks whose activations are kept per layer
    heldout_tokens: int = 16384  # held-out tokens for the before/after figures (0 = none)
    heldout_percent: float = 10.0  # FILE data: % of documents held out (by hash)
    # loss
    temperature: float = 1.0
    kl_weight: float = 1.0
    ce_weight: float = 0.0  # + next-token cross-entropy on the data
    hidden_weight: float = 0.0  # + per-layer hidden-state MSE (relative); online teacher only
    # teacher
    teacher: str = "online"  # online: teacher forward every step | cache: top-k logits on disk first
    topk: int = 64  # cache: logits kept per position (0 = the whole vocabulary)
    # optimizer and schedule
    optimizer: str = "adamw"
    lr: float = 0.0  # 0 = the mode's default (DEFAULT_LR)
    weight_decay: float = 0.0
    betas: tuple[float, ...] = (0.9, 0.95)
    momentum: float = 0.9  # sgd
    schedule: str = "cosine"  # cosine | linear (to min_lr) | constant, after linear warmup
    warmup: int = 10  # steps
    min_lr_ratio: float = 0.1  # the schedule ends at lr * this
    grad_clip: float = 1.0  # max global gradient norm (0 = off)
    seed: int = 0
    impl: str = "auto"  # format kernels for fake quantization: auto (fused, bit-exact) | reference
    # long runs
    checkpoint_every: int = 50  # steps between checkpoints in resume_dir
    log_every: int = 10  # steps between metrics lines
    resume_dir: str = runtime("")  # --resume-dir: checkpoints, metrics.jsonl, teacher cache
    metrics: str = runtime("")  # --metrics FILE: JSON lines (default RESUME_DIR/metrics.jsonl)
    device: str = runtime("auto")  # --device: where teacher and student run (tfcompile/dist/devices.py)
    # --sharding, under torchrun: ddp (every rank holds the student), fsdp (FSDP2: each rank a 1/N
    # shard of the student's parameters, gradients and optimizer state), auto (fsdp when the DDP
    # student does not fit one device: tfcompile/distill/fsdp.py). Same artifact either way.
    sharding: str = runtime("auto")

    def __post_init__(self) -> None:
        for name, allowed in (("train", TRAIN), ("mode", MODES), ("teacher", TEACHERS),
                              ("optimizer", OPTIMIZERS), ("schedule", SCHEDULES), ("sharding", SHARDINGS)):
            if getattr(self, name) not in allowed:
                raise RecipeError(f"distill.{name} {getattr(self, name)!r} is not one of {', '.join(allowed)}",
                                  hint=f"--set distill.{name}={allowed[0]}")
        for name in ("seq_len", "batch", "grad_accum", "steps", "layer_samples", "lora_rank",
                     "checkpoint_every", "log_every"):
            if getattr(self, name) < 1:
                raise RecipeError(f"distill.{name} must be at least 1, got {getattr(self, name)}",
                                  hint=f"--set distill.{name}=N with N >= 1")
        if self.train_unquantized and self.train != "weights":
            raise RecipeError(f"distill.train_unquantized goes with distill.train weights, not {self.train}",
                              hint="--set distill.train=weights, or drop distill.train_unquantized")
        if self.init and self.mode != "model":
            raise RecipeError("distill.init goes with distill.mode model (the layer-wise student is the "
                              "teacher converted in place)", hint="--set distill.mode=model, or drop distill.init")
        check_device(self.device, "distill.device")
        if self.impl not in ("auto", "reference"):
            raise RecipeError(f"distill.impl {self.impl!r} is not auto or reference",
                              hint="--set distill.impl=reference (the plain-torch formats)")
        if self.temperature <= 0 or self.lr < 0 or self.heldout_tokens < 0 or self.topk < 0:
            raise RecipeError("distill.temperature must be > 0 and lr, heldout_tokens, topk >= 0",
                              hint="e.g. --set distill.temperature=2 --set distill.lr=1e-4")
        if self.kl_weight == 0 and self.ce_weight == 0 and self.hidden_weight == 0:
            raise RecipeError("distill: every loss weight is 0", hint="--set distill.kl_weight=1")
        if self.hidden_weight and self.teacher == "cache":
            raise RecipeError("distill.hidden_weight needs the teacher's hidden states, which the "
                              "logit cache does not keep", hint="use --set distill.teacher=online")
        if not 0 < self.heldout_percent < 100:
            raise RecipeError(f"distill.heldout_percent {self.heldout_percent} is not in (0, 100)",
                              hint="e.g. --set distill.heldout_percent=10")

    @property
    def learning_rate(self) -> float:
        return self.lr or DEFAULT_LR[self.train]
