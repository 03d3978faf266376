"""Is the checkpoint the whole model config.json describes? Checked before any pass runs.

transformers builds the architecture named in config.json on the meta device
(no memory, no weights read, no checkpoint code: never `trust_remote_code`),
and then its own loader (`convert_and_load_state_dict_in_model`, the code
`from_pretrained` runs) is fed meta tensors with the checkpoint's names,
shapes and dtypes. So every rule is the model's own declaration, not a name
list of ours:
- key renames and fusions (`get_model_conversion_mapping`): per-expert MoE
  tensors feeding transformers v5's fused 3-D `experts.gate_up_proj`, legacy
  prefixes, the base-model prefix;
- tied parameters (`all_tied_weights_keys`): a tied `lm_head` needs no tensor;
- declared ignorable keys (`_keys_to_ignore_on_load_missing/unexpected`, old
  per-layer `rotary_emb.inv_freq` buffers): allowed;
- the multi-token-prediction layers config.json declares (tfcompile/families/mtp.py):
  not judged by the model, which has no module for them; kept in the artifact;
- buffers (non-persistent ones such as RoPE's `inv_freq`) are never required.

Problems: a parameter with no tensor (missing), a tensor the model has no
place for (unexpected: it would be silently dropped by every loader), a shape
that differs, a fused group that cannot be assembled, a parameter whose
tensor is not BF16/F16/F32. Any of them fails the run with one summary.

An architecture transformers does not have cannot be checked; it is refused
unless the user passes `--allow-unknown-architecture` (`load.allow_unknown_architecture`).

Plain dense decoders (Llama, Mistral, Qwen2, Qwen3: tfcompile/families/dense.py) are checked first
from config.json and the headers alone, without importing transformers' modeling module (~3-6 s):
a checkpoint that is exactly the parameter table passes there. The meta model is still built
(a) for every other architecture (MoE experts and their fusions, tied or renamed keys, VLMs:
transformers' conversion mapping is the rule), (b) when the table does not match, so the error
names what transformers' own loader finds, and (c) in verify's and plan's config checks
(artifact/shapes.py, estimate/shapes.py), which read module shapes from it.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from tfcompile.errors import CheckpointError
from tfcompile.families import V5, family_of
from tfcompile.families.dense import dense_spec, matches
from tfcompile.families.experts import PROJS, fuse_bias, fuse_weight
from tfcompile.families.mtp import is_mtp, mtp_prefixes
from tfcompile.families.names import NameMap
from tfcompile.io.dtypes import code_of, torch_dtype_of
from tfcompile.io.hf_config import transformers_class

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_SHOW = 5  # names shown per kind of problem


@dataclass
class Problems:
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)  # "name: checkpoint [..], model [..]"
    conversion: list[str] = field(default_factory=list)
    dtype: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return any((self.missing, self.unexpected, self.mismatched, self.conversion, self.dtype))

    def summary(self) -> str:
        parts = []
        for label, items in (("{n} parameter{s} with a non-float tensor", self.dtype),
                             ("missing {n} parameter{s}", self.missing),
                             ("{n} tensor{s} whose shape differs from the model's", self.mismatched),
                             ("{n} fused parameter{s} whose source tensors do not fit together", self.conversion),
                             ("{n} unexpected tensor{s} the model has no place for", self.unexpected)):
            if items:
                more = f", and {len(items) - _SHOW} more" if len(items) > _SHOW else ""
                label = label.format(n=len(items), s="" if len(items) == 1 else "s")
                parts.append(label + ": " + ", ".join(items[:_SHOW]) + more)
        return "; ".join(parts)


def model_class(config: dict):
    """The transformers PreTrainedModel class named by config.json's architectures, or None."""
    # lazy: transformers (~2 s to import); only when a model is built
    import transformers

    arch = (config.get("architectures") or [None])[0]
    cls = transformers_class(arch)
    if not isinstance(cls, type) or not issubclass(cls, transformers.PreTrainedModel):
        return None
    return cls


def build_meta_model(config: dict, where: str):
    """The architecture of `config` (a config.json dict) on the meta device; None if unknown.

    CheckpointError when transformers has the class but cannot build it from these values."""
    # lazy: transformers (~2 s to import); only when a model is built
    import transformers

    cls = model_class(config)
    if cls is None:
        return None
    values = {k: v for k, v in config.items() if k != "quantization_config"}
    try:
        with _quiet_transformers():
            hf_config = cls.config_class.from_dict(values)
            with torch.device("meta"):
                model = cls(hf_config)
    except Exception as e:  # noqa: BLE001 - any failure is a config.json transformers cannot use
        msg = " ".join(f"{type(e).__name__}: {e}".split())
        raise CheckpointError(f"{where}: transformers {transformers.__version__} cannot build "
                              f"{cls.__name__} from it ({msg[:300]})",
                              hint="config.json has a value this architecture does not accept; fix or "
                                   "re-download it") from None
    return model.eval()


@dataclass
class _Report:
    """What a load of the checkpoint into the model found (transformers' LoadStateDictInfo fields)."""

    missing_keys: set
    unexpected_keys: set
    mismatched_keys: set  # (name, checkpoint shape, model shape)
    conversion_errors: dict


def _transformers_report(model, state: dict):
    """transformers' own loader (renames, MoE fusion, base-model prefix) on meta tensors."""
    # lazy: transformers (~2 s to import); only when a model is built
    # lazy: transformers (~2 s to import); only when a model is built
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import convert_and_load_state_dict_in_model
    from transformers.modeling_utils import LoadStateDictConfig

    load_config = LoadStateDictConfig(weight_mapping=get_model_conversion_mapping(model), device_map={"": "meta"})
    return convert_and_load_state_dict_in_model(model=model, state_dict=state, load_config=load_config)[0]


def _direct_report(model, state: dict) -> _Report:
    """Name-for-name matching, for a transformers without the v5 loader API (no renames or fusion)."""
    expected = model.state_dict()
    return _Report(missing_keys=set(expected) - set(state), unexpected_keys=set(state) - set(expected),
                   mismatched_keys={(n, tuple(t.shape), tuple(expected[n].shape)) for n, t in state.items()
                                    if n in expected and tuple(t.shape) != tuple(expected[n].shape)},
                   conversion_errors={})


def find_problems(model, tensors: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> Problems:
    """Load meta tensors {name: (dtype, shape)} into meta `model` with transformers' own loader."""
    state = {n: torch.empty(shape, dtype=dtype, device="meta") for n, (dtype, shape) in tensors.items()}
    params = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    buffers = {n for n, _ in model.named_buffers(remove_duplicate=False)}
    with _quiet_transformers():
        try:
            info = _transformers_report(model, state)
        except ImportError:  # transformers moved its loader: the plain check still catches most
            info = _direct_report(model, state)
        not_loaded = set(info.unexpected_keys)  # before the declared ignorable ones are dropped
        adjust = getattr(model, "_adjust_missing_and_unexpected_keys", None)
        if adjust is not None:
            adjust(info)  # the model's declared ignorable keys
    missing = set(info.missing_keys) & params
    for target, source in (getattr(model, "all_tied_weights_keys", None) or {}).items():
        if target not in missing or source not in missing:  # one of a tied pair is enough
            missing -= {target, source}
    failed = set(info.conversion_errors)
    problems = Problems(
        missing=_natural(missing - failed),
        unexpected=_natural(set(info.unexpected_keys) - buffers),
        mismatched=[f"{n}: checkpoint {list(got)}, model {list(want)}"
                    for n, got, want in sorted(info.mismatched_keys, key=lambda x: _key(x[0]))],
        conversion=[f"{n} ({_last_line(msg)})" for n, msg in sorted(info.conversion_errors.items())],
    )
    # The loader casts to the parameter's dtype, so judge the checkpoint's own dtypes: every tensor it
    # loads into a parameter (not a buffer, not one it drops) must be floating point. A buffer is known
    # by its in-memory name (the model's renames: DeepSeek-V4's `ffn.gate.tid2eid`, int64 token ->
    # expert ids, is the buffer `mlp.gate.tid2eid`).
    other = [n for n, (dtype, _) in tensors.items() if dtype not in FLOAT_DTYPES and n not in not_loaded]
    to_model = NameMap(model, tensors).to_model if other else None
    problems.dtype = [f"{n} is {_code(tensors[n][0])}" for n in sorted(other, key=_key) if to_model(n) not in buffers]
    return problems


def check_checkpoint(config: dict, tensors: dict[str, tuple[torch.dtype, tuple[int, ...]]], *, where: str,
                     allow_unknown: bool = False) -> str | None:
    """Raise CheckpointError unless `tensors` is exactly the model `config` describes.

    Returns a warning for an unknown architecture allowed by `allow_unknown` (None otherwise)."""
    if _fits_dense_spec(config, tensors):
        return None  # config.json and the headers suffice: no transformers import
    model = build_meta_model(config, f"{where}/config.json")
    arch = config["architectures"][0]
    if model is None:
        if not allow_unknown:
            raise CheckpointError(
                f"{where}/config.json: architecture {arch!r} is not in transformers, so tfcompile cannot check "
                "that the checkpoint holds every tensor of the model with the right shape",
                hint="pass --allow-unknown-architecture to quantize it by tensor names alone (missing, misshapen "
                     "or extra tensors then go undetected; see docs/cli.md \"Safety\")")
        return (f"architecture {arch!r} is not in transformers: the checkpoint's completeness, shapes and "
                "dtypes were not checked (--allow-unknown-architecture); calibration-based formats and verify's "
                "config checks need a transformers architecture, and engines may not load the result")
    problems = find_problems(model, fuse_unmapped_experts(model, config, without_mtp(config, tensors)))
    if problems:
        raise CheckpointError(f"{where}: the checkpoint does not match the {arch} that config.json describes: "
                              f"{problems.summary()}",
                              hint="the checkpoint is incomplete or config.json does not describe it; re-download "
                                   "it or fix config.json (tfcompile never quantizes a partial model)")
    return None


def _fits_dense_spec(config: dict, tensors: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> bool:
    """Exactly the plain dense decoder config.json describes, every tensor BF16/F16/F32 (all are parameters)."""
    spec = dense_spec(config)
    return spec is not None and all(dtype in FLOAT_DTYPES for dtype, _ in tensors.values()) \
        and matches(spec, {name: shape for name, (_, shape) in tensors.items()})


def without_mtp(config: dict, tensors: dict) -> dict:
    """`tensors` but the MTP layers config.json declares: transformers' model has no module for them
    (declared ignorable there, or not at all for a small test model) but engines load them, so they
    are kept and not judged by the model (tfcompile/families/mtp.py)."""
    mtp = mtp_prefixes(config)
    return {n: v for n, v in tensors.items() if not is_mtp(n, mtp)}


_EXPERT = re.compile(r"^(?P<base>.*\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.(?P<leaf>weight|bias)$")


def fuse_unmapped_experts(model, config: dict, tensors: dict) -> dict:
    """Per-expert tensors fused (as meta tensors) for families whose expert layout transformers' loader
    has no conversion for (GPT-OSS: interleaved, transposed, with biases; tfcompile/families/experts.py),
    so the check sees what our calibration binds and engines re-fuse. Other layouts are left to
    transformers' own mapping. A group that does not stack (a missing expert, a wrong shape) stays
    unfused and is reported as unexpected/missing."""
    layout = family_of(config).experts
    if layout == V5:
        return tensors
    params = {n for n, _ in model.named_parameters()}
    groups: dict[tuple[str, str], dict[str, dict[int, tuple]]] = {}
    for name, spec in tensors.items():
        m = _EXPERT.match(name)
        if m and f"{m['base']}.gate_up_proj" in params:
            groups.setdefault((m["base"], m["leaf"]), {}).setdefault(m["proj"], {})[int(m["e"])] = spec
    out = dict(tensors)
    for (base, leaf), by_proj in groups.items():
        n = len(by_proj.get("down_proj", {}))
        if n == 0 or any(sorted(by_proj.get(p, {})) != list(range(n)) for p in PROJS):
            continue
        parts = {p: [torch.empty(by_proj[p][e][1], dtype=by_proj[p][e][0], device="meta") for e in range(n)]
                 for p in PROJS}
        try:
            fused = fuse_bias(parts, layout) if leaf == "bias" else fuse_weight(parts, layout)
        except RuntimeError:  # experts of different shapes: leave them for the report to name
            continue
        for e in range(n):
            for p in PROJS:
                del out[f"{base}.{e}.{p}.{leaf}"]
        for kind, t in fused.items():
            out[f"{base}.{kind}{'' if leaf == 'weight' else '_bias'}"] = (t.dtype, tuple(t.shape))
    return out


def checkpoint_tensors(ckpt) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """{name: (dtype, shape)} of an open `Checkpoint` (headers only)."""
    out = {}
    for name in ckpt.names():
        info = ckpt.info(name)
        try:
            dtype = torch_dtype_of(info.dtype)
        except Exception:  # noqa: BLE001 - a dtype torch lacks: only its shape matters here
            dtype = torch.uint8
        out[name] = (dtype, tuple(info.shape))
    return out


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No transformers log lines or progress bars on our stderr while it builds and matches."""
    # lazy: transformers (~2 s to import); only when a model is built
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _code(dtype: torch.dtype) -> str:
    try:
        return code_of(dtype)
    except Exception:  # noqa: BLE001
        return str(dtype).removeprefix("torch.")


def _last_line(text: Any) -> str:
    """The torch error of a conversion traceback (transformers appends its own 'Error: ...' line)."""
    lines = [x.strip() for x in str(text).strip().splitlines() if x.strip() and not x.strip().startswith("Error:")]
    return (lines[-1] if lines else "")[:200]


def _key(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def _natural(names) -> list[str]:
    return sorted(names, key=_key)
