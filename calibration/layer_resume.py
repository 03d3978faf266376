"""`calibrate.resume_dir` (`quantize --resume-dir`): the layer loop's solved layers kept on disk,
so a run killed at layer i resumes there and writes the same artifact, byte for byte.

A layer solver (learned rounding; GPTQ under calibrate.propagate) is the expensive part of the
loop: minutes per block where the forwards take seconds. Its answer for a layer is all that the
rest of the run reads from it (the codes pack writes; the weights the later layers run with), so
that answer is what is kept. A resumed run still runs every layer's forwards (the statistics and
the activation streams are rebuilt exactly; they are cheap beside the solve) but hands a saved
layer's answer back instead of solving it again.

Layout of the folder (tfcompile/io/resume.py checks `run.json`, the run's fingerprint):
  layer-{i:05d}.rank{r}.safetensors   layer i's answer on rank r: tensors `codes.<group key>`
                                      (uint8, as the loop keeps them) and `weight.<module>` (the
                                      dequantized weight, the solver's dtype); metadata `record`:
                                      the solver's JSON record of the layer (e.g. block losses)
Each file is written to a temporary name, fsynced and renamed, so a kill leaves whole files;
it is read by safetensors (no pickle).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load, save

from tfcompile.errors import UserError
from tfcompile.io.atomic import write_atomic
from tfcompile.io.resume import claim

CODES, WEIGHT = "codes.", "weight."
OPTION = "--resume-dir (calibrate.resume_dir)"


class LayerCheckpoints:
    """One rank's saved layer answers under a claimed resume folder."""

    def __init__(self, path: str | Path, fingerprint: dict, rank: int = 0):
        self.path = claim(path, fingerprint, OPTION)
        self.rank = rank
        self.resumed: list[int] = []  # layers answered from the folder in this run

    def _file(self, i: int) -> Path:
        return self.path / f"layer-{i:05d}.rank{self.rank}.safetensors"

    def load(self, i: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict] | None:
        """Layer i's (codes, weights, record), or None when it was not solved yet."""
        f = self._file(i)
        if not f.is_file():
            return None
        try:
            data = f.read_bytes()
            tensors = load(data)
            record = json.loads(_metadata(data).get("record", "{}"))
        except Exception as e:  # noqa: BLE001 - a damaged file: name it
            raise UserError(f"{OPTION}: cannot read {f} ({type(e).__name__}: {e})",
                            hint=f"delete {f} to solve layer {i} again") from None
        codes = {k[len(CODES):]: t for k, t in tensors.items() if k.startswith(CODES)}
        weights = {k[len(WEIGHT):]: t for k, t in tensors.items() if k.startswith(WEIGHT)}
        self.resumed.append(i)
        return codes, weights, record

    def save(self, i: int, codes: Mapping[str, torch.Tensor], weights: Mapping[str, torch.Tensor],
             record: dict) -> None:
        # clones: safetensors refuses views that share storage (a group's members may)
        tensors = {CODES + k: v.detach().contiguous().clone() for k, v in codes.items()}
        tensors |= {WEIGHT + k: v.detach().contiguous().clone() for k, v in weights.items()}
        data = save(tensors, metadata={"record": json.dumps(record, sort_keys=True)})
        write_atomic(self._file(i), data)


def _metadata(data: bytes) -> dict:
    """The `__metadata__` of a safetensors file's header (8-byte little-endian length, then JSON)."""
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8: 8 + n]).get("__metadata__") or {}
