"""`--resume-dir`: training checkpoints, metrics and the teacher cache of one run.

Layout:
  run.json        the run's fingerprint (recipe without runtime fields, source
                  config and tensor sizes, torch version, thread count); a
                  directory made by another run is refused, never silently reused
  state.pt        the last checkpoint: trainable parameters, optimizer and LR
                  scheduler state, torch RNG state, and the position (optimizer
                  steps done; data order is a pure function of seed and step).
                  Written to a temporary name, fsynced, then renamed, so a kill
                  at any moment leaves the previous checkpoint whole.
  metrics.jsonl   one JSON line per logged step (default --metrics)
  teacher/        the top-k teacher cache (distill.teacher=cache)

`state.pt` is read with `torch.load(weights_only=True)`: tensors and plain
containers only, no arbitrary unpickling.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from tfcompile.errors import UserError
from tfcompile.io.atomic import atomic_file, write_atomic
from tfcompile.io.resume import claim

STATE, METRICS = "state.pt", "metrics.jsonl"


class ResumeDir:
    def __init__(self, path: Path, fingerprint: dict):
        self.path = Path(path)
        self.fingerprint = fingerprint

    @classmethod
    def open(cls, path: str | os.PathLike, fingerprint: dict) -> "ResumeDir":
        """Create `path`, or check that it belongs to this run (tfcompile/io/resume.py)."""
        return cls(claim(path, fingerprint), fingerprint)

    def load(self) -> dict[str, Any] | None:
        f = self.path / STATE
        if not f.is_file():
            return None
        try:
            return torch.load(f, weights_only=True)
        except Exception as e:  # noqa: BLE001 - a damaged file: name it
            raise UserError(f"--resume-dir {self.path}: cannot read {STATE} ({type(e).__name__}: {e})",
                            hint=f"delete {f} to start over from the beginning") from None

    def save(self, state: dict[str, Any]) -> None:
        with atomic_file(self.path / STATE) as fh:  # fsynced, then renamed: a kill keeps the last one
            torch.save(state, fh)

    @property
    def teacher_dir(self) -> Path:
        return self.path / "teacher"


class MetricsLog:
    """JSON lines, one per logged step. On resume, lines past the checkpoint are dropped,
    so the file reads as one run (their timings aside)."""

    def __init__(self, path: Path | None, resume_step: int):
        self.path = path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if resume_step and path.is_file():
            for line in path.read_text().splitlines():
                try:
                    if json.loads(line).get("step", 0) <= resume_step:
                        kept.append(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a kill
        write_atomic(path, "".join(x + "\n" for x in kept).encode(), fsync=False)

    def write(self, record: dict) -> None:
        if self.path is None:
            return
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
