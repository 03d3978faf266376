"""`DraftConfig`: every setting of `tfcompile draft` (EAGLE-3 training), and the draft's shape.

Fields marked `runtime` say where work is kept, not what is computed; they are left out
of the recorded config and the resume fingerprint.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from tfcompile.draft.eagle3 import DraftShape
from tfcompile.errors import UserError

METHODS = ("eagle3",)
INITS = ("target", "random")
CACHE_DTYPES = ("float32", "bfloat16")  # cache.DTYPES
CACHE_PLACES = ("memory", "disk")  # cache.PLACES
COMPUTE_DTYPES = ("float32", "bfloat16", "auto")  # tfcompile.machine.COMPUTE_DTYPES
DEFAULT_DRAFT_VOCAB = 32000  # EAGLE-3's and speculators' reduced draft vocabulary


def runtime(default):
    return field(default=default, metadata={"runtime": True})


@dataclass(frozen=True)
class DraftConfig:
    method: str = "eagle3"
    steps: int = 200  # optimizer steps
    batch: int = 4  # sequences per step
    # equal parts a step's batch is computed in, one forward and backward each (gradients averaged);
    # 0: the number of processes (under torchrun each rank computes P / N parts: ranks.py). Recorded
    # resolved (left out when 1): the bits of a step depend on it; the number of processes does not
    # change them for N <= 2
    batch_parts: int = 0
    seq_len: int = 128  # tokens per training sequence
    data: str = "python-doc"  # the training text (distill's loaders: python-doc train split, FILE, ...)
    text_blocks: int = 256  # sequences of training text
    self_blocks: int = 64  # sequences the target generates itself (greedy, from text prompts)
    self_prompt: int = 32  # prompt tokens of those (the rest is the target's continuation)
    ttt_steps: int = 3  # chain steps trained ("training-time test"); also speculative_tokens written
    ttt_decay: float = 1.0  # loss weight of chain step j = ttt_decay ** j
    draft_vocab: int = 0  # 0: the target's vocabulary up to DEFAULT_DRAFT_VOCAB, the most frequent ids
    aux_layers: tuple[int, ...] = ()  # target hidden_states indices fused; () = low / middle / high
    init: str = "target"  # "target": fc and the layer start from the target (run.init_from_target); "random"
    init_from: str = ""  # a speculators draft directory to continue from (its weights and vocabulary; overrides init)
    # the target cache's values (cache.py): float32, or bfloat16 (half the memory or disk; rounds the
    # target's hidden states as a bf16 engine hands them to its draft). Recorded only when not float32
    cache_dtype: str = "float32"
    # what the target's forwards (its cache and its self-generated text) compute in: float32 (the dtype
    # `tfcompile eval` serves the target in), bfloat16, or auto (tfcompile.machine.compute_dtype: bf16
    # where the CPU computes it natively and the checkpoint is bf16, 3.8x faster for SmolLM2 on
    # AVX512-BF16). run.py resolves auto before anything records it; recorded only when not float32
    compute_dtype: str = "float32"
    # optimizer (tfcompile.distill.train.Loop reads these names)
    optimizer: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, ...] = (0.9, 0.95)
    momentum: float = 0.9
    schedule: str = "cosine"
    warmup: int = 10
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 50
    log_every: int = 10
    resume_dir: str = runtime("")
    metrics: str = runtime("")
    device: str = runtime("auto")
    cache: str = runtime("memory")  # where the target cache is kept: memory | disk (files in resume_dir)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UserError(f"--method {self.method!r} is not supported",
                            hint="choose one of: " + ", ".join(METHODS))
        if self.cache_dtype not in CACHE_DTYPES:
            raise UserError(f"--cache-dtype {self.cache_dtype!r} is not supported",
                            hint="choose one of: " + ", ".join(CACHE_DTYPES))
        if self.compute_dtype not in COMPUTE_DTYPES:
            raise UserError(f"--compute-dtype {self.compute_dtype!r} is not supported",
                            hint="choose one of: " + ", ".join(COMPUTE_DTYPES))
        if self.cache not in CACHE_PLACES:
            raise UserError(f"--cache {self.cache!r} is not supported", hint="choose one of: " + ", ".join(CACHE_PLACES))
        if self.cache == "disk" and not self.resume_dir:
            raise UserError("--cache disk keeps the target cache in the resume folder, and none was given",
                            hint="pass --resume-dir DIR (it needs about 4 x hidden_size values per training token)")
        if self.init not in INITS:
            raise UserError(f"--init {self.init!r} is not supported", hint="choose one of: " + ", ".join(INITS))
        for name in ("steps", "batch", "seq_len", "ttt_steps", "checkpoint_every", "log_every"):
            if getattr(self, name) < 1:
                raise UserError(f"draft {name} must be >= 1 (got {getattr(self, name)})",
                                hint=f"give a positive --{name.replace('_', '-')}")
        if self.batch_parts < 0:
            raise UserError(f"draft batch_parts must be >= 0 (got {self.batch_parts})",
                            hint="give --batch-parts P with P dividing --batch, or 0 for the number of processes")
        if not 0 < self.self_prompt < self.seq_len:
            raise UserError(f"draft self_prompt {self.self_prompt} must lie in (0, seq_len={self.seq_len})",
                            hint="lower --self-prompt or raise --seq-len")
        if self.text_blocks + self.self_blocks < self.batch:
            raise UserError("draft: fewer training sequences than one batch",
                            hint="raise --text-blocks / --self-blocks or lower --batch")

    @property
    def learning_rate(self) -> float:
        return self.lr

    def record(self) -> dict:
        """The config without runtime fields (manifest, resume fingerprint)."""
        d = asdict(self)
        rec = {f.name: _plain(d[f.name]) for f in fields(self) if not f.metadata.get("runtime")}
        if self.batch_parts <= 1:  # one part (or not resolved yet): the computation from before the option,
            del rec["batch_parts"]  # so one process's record and resume fingerprint keep their bytes
        if self.cache_dtype == "float32":  # the cache from before the option: records and resume folders unchanged
            del rec["cache_dtype"]
        if self.compute_dtype == "float32":  # float32 forwards, as before the option
            del rec["compute_dtype"]
        return rec


def _plain(v):
    return list(v) if isinstance(v, tuple) else v


def aux_layers(n_layers: int, given: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The hidden_states indices (input of layer i; n_layers = the last) EAGLE-3 fuses.

    speculators' default [2, L // 2, L - 3]; for models too shallow for it (fewer than 6
    layers) three evenly spaced distinct layers in 1..L-1."""
    ids = tuple(given) or (2, n_layers // 2, n_layers - 3)
    if len(set(ids)) != len(ids) or min(ids) < 0 or max(ids) > n_layers:
        if given:
            raise UserError(f"--aux-layers {list(given)} must be distinct, in [0, {n_layers}]",
                            hint=f"the target has {n_layers} decoder layers")
        ids = tuple(sorted({max(1, round(n_layers * f)) for f in (0.25, 0.5, 0.75)}))
    if len(ids) != 3:
        raise UserError(f"EAGLE-3 fuses three hidden states; the target's {n_layers} layers give {list(ids)}",
                        hint="pass --aux-layers A,B,C")
    return ids


def shape_of(cfg: dict, draft_vocab: int, aux: tuple[int, ...]) -> DraftShape:
    """The draft's shape from the target's config.json dict (Llama layout only)."""
    if cfg.get("model_type") != "llama":
        raise UserError(f"tfcompile draft builds EAGLE-3 drafts of Llama-layout targets; this one is "
                        f"{cfg.get('model_type')!r}",
                        hint="draft a Llama-architecture model (Llama, SmolLM2, the demo LM)")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default":
        raise UserError(f"rope type {rope.get('rope_type')!r} is not supported by the draft",
                        hint="draft a model with the default rotary embedding")
    heads = int(cfg["num_attention_heads"])
    return DraftShape(hidden=int(cfg["hidden_size"]), intermediate=int(cfg["intermediate_size"]),
                      heads=heads, kv_heads=int(cfg.get("num_key_value_heads") or heads),
                      head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
                      vocab=int(cfg["vocab_size"]), draft_vocab=draft_vocab,
                      rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                      rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
                      aux_layers=tuple(aux))
