"""Run the model over calibration tokens and observe Linear inputs.

This is the simple, whole-model loop: the model is instantiated by
transformers from the checkpoint directory (no remote code, `trust_remote_code`
never set) and run in its dtype on CPU, with forward pre-hooks recording
max |x| per observed module. Tokens come from `calibration.datasets`: by
default (`auto`) the python-doc calib split when installed and the tokenizer encodes it, else
short sequences the model samples itself (seeded), so it needs no data set.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from tfcompile.calibration.datasets import calibration_tokens, effective_source, tokens_sha256
from tfcompile.calibration.recorders import Recorders
from tfcompile.dist import LOCAL
from tfcompile.dist.collect import broadcast
from tfcompile.dist.partition import rounds
from tfcompile.errors import CheckpointError
from tfcompile.io.hf_config import load_hf_config, transformers_class
from tfcompile.io.sources.model import is_published, load_decoded_model
from tfcompile.ir import CalibStats


class Silent:
    """The progress protocol of a pipeline reporter (task / advance), doing nothing."""

    def task(self, description: str, total: int | None) -> None: ...

    def advance(self, n: int = 1, detail: str | None = None) -> None: ...


def model_class(model_dir: Path, cfg):
    """The transformers class named by config.json's architectures (never remote code)."""

    arch = (cfg.architectures or [None])[0]
    cls = transformers_class(arch)
    if cls is None:
        raise CheckpointError(f"{model_dir}/config.json: architecture {arch!r} is not in transformers",
                              hint="calibration needs a transformers architecture; use a weight-only "
                                   "or dynamic-activation format (e.g. nvfp4a16, fp8-dynamic)")
    return cls


def load_hf_model(model_dir: Path, dtype: torch.dtype):
    """The transformers model for config.json's architecture, weights loaded (a published quantized
    checkpoint: decoded by tfcompile, tfcompile/io/sources/model.py)."""
    import transformers  # lazy: transformers (~2 s to import); only when a model is built

    transformers.utils.logging.disable_progress_bar()  # stderr belongs to our reporter
    cfg = load_hf_config(model_dir)  # CheckpointError for a config transformers cannot read
    if is_published(cfg.to_dict()):
        return load_decoded_model(model_dir, dtype)
    cls = model_class(model_dir, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls.from_pretrained(model_dir, dtype=dtype, trust_remote_code=False)
    return model.eval()


def load_tokenizer(model_dir: Path):
    """The checkpoint's own tokenizer (local files only), or None if it has none."""
    from transformers import \
        AutoTokenizer  # lazy: transformers (~2 s to import); only when a model is built

    try:
        return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False, local_files_only=True)
    except (OSError, ValueError):
        return None


def model_vocab(model) -> int:
    return int(getattr(model.config, "vocab_size", None) or model.get_input_embeddings().num_embeddings)


def resolve_data(model_dir: Path, model, data: str, samples: int, seq_len: int) -> tuple[str, object]:
    """(the source calibration really uses, the checkpoint's tokenizer or None): `auto` and
    `self` resolved (calibration.datasets.effective_source) before any token is made."""
    tokenizer = load_tokenizer(model_dir)
    return effective_source(data, model, tokenizer, vocab=model_vocab(model), tokens=samples * seq_len), tokenizer


def calibration_ids(model_dir: Path, model, *, data: str, samples: int, seq_len: int,
                    seed: int, tokenizer=None, progress=None) -> torch.Tensor:
    """The calibration token ids, int64 [samples, seq_len] (see calibration.datasets)."""
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_dir)
    if tokenizer is None and data not in ("self", "random", "auto"):
        raise CheckpointError(f"{model_dir}: no tokenizer files, so calibration text cannot be tokenized",
                              hint="add the tokenizer to the checkpoint, or use --calib self / random")
    return calibration_tokens(data, tokenizer, samples=samples, seq_len=seq_len, seed=seed,
                              model=model, vocab=model_vocab(model), progress=progress)


def final_norm(model) -> torch.nn.Module:
    """The decoder's final norm: its output is what vLLM hands an MTP proposer (draft/mtp.py)."""
    return model.get_decoder().norm


def observe_input_amax(model_dir: Path, modules: set[str], *, data: str, samples: int, seq_len: int,
                       seed: int, dtype: torch.dtype, kv: bool = False, observer: str = "max",
                       observer_params: dict | None = None,
                       statistics: Mapping[str, Mapping[str, Any]] | None = None,
                       groups: Mapping[str, str] | None = None, all_experts: bool = False,
                       moe_min_tokens: int = 16, world=LOCAL, device: torch.device | str = "cpu",
                       owner: Mapping[str, int] | None = None, progress=None, on_final=None) -> CalibStats:
    """Statistics of every module in `modules` (see `Recorders`) over `samples` x `seq_len`
    calibration tokens, running the whole model at once (the model must fit in RAM, and on
    `device`). `statistics` (name -> options) adds registered statistics of the fusion `groups`
    (member Linear -> group key; calibration/statistics.py). Under torchrun (`world`) sequence i
    runs on rank i mod N. `on_final`: as `sequential.observe_sequential`'s (one sequence a batch)."""
    model = load_hf_model(model_dir, dtype)
    data, tokenizer = resolve_data(model_dir, model, data, samples, seq_len)  # auto, self -> the real source
    # Tokens first: sampling them from the model (`self`) runs it, and no hook may see that.
    progress = progress or Silent()
    ids = calibration_ids(model_dir, model, data=data, samples=samples, seq_len=seq_len, seed=seed,
                          tokenizer=tokenizer, progress=progress) if world.is_root else None
    ids = broadcast(world, ids)
    model.to(device)
    rec = Recorders(model, modules, observer=observer, observer_params=observer_params, kv=kv,
                    statistics=statistics, groups=groups, all_experts=all_experts,
                    moe_min_tokens=moe_min_tokens, world=world, owner=owner, compute_dtype=dtype)
    rec.begin(ids)  # every rank sees every token id (a statistic may run the model on some at the end)
    n_rounds = rounds(len(ids), world.size)
    progress.task(f"calibrate {len(ids)} sequences (whole model)", n_rounds)
    finals: list[tuple[torch.Tensor, torch.Tensor]] = []  # (ids [1, T], the final norm's input [1, T, H])
    keep = None if on_final is None else final_norm(model).register_forward_pre_hook(
        lambda mod, args: finals.append((ids[len(finals) * world.size + world.rank][None], args[0])))
    try:
        with torch.inference_mode():
            for r in range(n_rounds):  # round r: sequences r*N .. r*N+N-1
                i = r * world.size + world.rank
                if i < len(ids):
                    model(input_ids=ids[i][None].to(device))
                rec.flush()
                progress.advance(1)
            if keep is not None:
                keep.remove()
                on_final(model, finals, n_rounds, f"{data}(seed={seed})")
    finally:
        rec.remove()
    stats = rec.stats(int(ids.numel()), f"{data}(seed={seed})", model_dir)
    return dataclasses.replace(stats, tokens_sha256=tokens_sha256(ids))
