"""Resume directories: a folder that one interrupted run left behind, and that only the same run
may continue (distill's and draft's `--resume-dir`, the layer loop's `calibrate.resume_dir`).

The folder's `run.json` is the run's fingerprint (whatever decides the result: recipe, source,
torch version, threads, processes). A folder made by another run is refused with the keys that
differ, never silently reused: a checkpoint is only valid for the computation that wrote it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from tfcompile.errors import UserError
from tfcompile.io.jsonfile import write_json

RUN = "run.json"


def claim(path: str | os.PathLike, fingerprint: dict, option: str = "--resume-dir") -> Path:
    """Create `path` (writing its fingerprint), or check that it belongs to this run. `option`:
    how the user named it, for the error."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{option} {path}: cannot create it ({e.strerror})",
                        hint="choose a directory you can write to") from None
    run = path / RUN
    if run.is_file():
        try:
            old = json.loads(run.read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"{option} {path}: cannot read {RUN} ({type(e).__name__}: {e})",
                            hint=f"delete {path} to start over") from None
        if old != fingerprint:
            diff = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
            raise UserError(f"{option} {path} holds another run (differs in: {', '.join(diff)})",
                            hint="resume with the same model, recipe and thread count, or give a new "
                                 f"{option} (or delete that one)")
    else:
        write_json(run, fingerprint, atomic=True)
    return path


def source_identity(src) -> dict:
    """The parts of a run's fingerprint that name its checkpoint (an open `Checkpoint`): its
    config and every tensor's name, dtype and shape (hashed; not the bytes: reading them all
    would cost a pass over the checkpoint), the torch version and thread count."""
    tensors = json.dumps([[n, src.info(n).dtype, list(src.info(n).shape)] for n in src.names()])
    return {"config_sha256": sha256_text(json.dumps(src.config, sort_keys=True)),
            "tensors_sha256": sha256_text(tensors), "torch": torch.__version__, "threads": torch.get_num_threads()}


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
