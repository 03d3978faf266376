"""Where a command may write: one policy for every command that writes.

quantize, distill and the torchrun ranks (through tfcompile/io/atomic.py), export-onnx,
report, sign and tune all call `check_output` (or `check_in_place` for the two that write
into an existing artifact) before anything is created. OUT is refused (UserError, exit 1)
when it
- is a source (MODEL, the artifact a command reads), lies inside one, or contains one;
- is the current directory or contains it;
- is, lies inside or contains a Hugging Face cache: the hub cache folder (`hub_cache()`), or a
  cache repo folder `models--ORG--NAME` (`datasets--`, `spaces--`) with a `snapshots/` folder;
- with --overwrite, contains a mount point (replacing OUT deletes the tree below it, and a
  bind-mounted MODEL is in that tree).

Every comparison is by file identity, (st_dev, st_ino) of each level of the path (the
path's own directory if it exists, then every existing ancestor of its resolved path), never
by path text: a symlink, a bind mount (`mount --bind MODEL X` gives X the device and inode of
MODEL) or a second spelling of the same directory is the same directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable

from tfcompile.errors import UserError
from tfcompile.io.hub import hub_cache

Ident = tuple[int, int]  # (st_dev, st_ino)
_CACHE_REPO = re.compile(r"(models|datasets|spaces)--.+")
_HINT_NEW = "write to a new directory outside the source and any Hugging Face cache, e.g. -o ./model-nvfp4"


def _ident(path: str | os.PathLike) -> Ident | None:
    try:
        st = os.stat(path)  # symlinks followed: a link to MODEL is MODEL
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def levels(path: str | os.PathLike) -> list[tuple[Path, Ident]]:
    """(directory, identity) of `path` if it exists, then of each existing ancestor of its resolved
    path, deepest first (realpath resolves symlinks and `..` in the existing part)."""
    real = Path(os.path.realpath(os.fspath(path) or "."))
    out = []
    for p in (real, *real.parents):
        ident = _ident(p)
        if ident is not None:
            out.append((p, ident))
    return out


def _is_cache_repo(directory: Path) -> bool:
    return bool(_CACHE_REPO.fullmatch(directory.name)) and (directory / "snapshots").is_dir()


def _check_cache(out: Path, own: Ident | None, chain: list[tuple[Path, Ident]], label: str) -> None:
    """Refuse an OUT that is, lies inside or contains a Hugging Face cache."""
    cache = levels(hub_cache()) if os.path.isdir(hub_cache()) else []
    cache_id = cache[0][1] if cache else None
    for d, ident in chain:
        if ident == cache_id or _is_cache_repo(d):
            raise UserError(f"{label} {out} is {'' if ident == own else 'inside '}the Hugging Face cache ({d}); "
                            "writing there would damage the cached models", hint=_HINT_NEW)
    if own is not None and own in {i for _, i in cache}:
        raise UserError(f"{label} {out} contains the Hugging Face cache {cache[0][0]}; --overwrite would delete it",
                        hint=_HINT_NEW)


def mount_points() -> list[Path]:
    """Mount points of this process's mount namespace (/proc/self/mountinfo; octal escapes decoded)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) > 4:
            out.append(Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), parts[4])))
    return out


def _check_mounts(out: Path) -> None:
    real = Path(os.path.realpath(out))
    for mp in mount_points():
        if mp != real and mp.is_relative_to(real):
            raise UserError(f"output {out} contains the mount point {mp}; --overwrite would delete what is "
                            "mounted there", hint="unmount it first, or write to a new directory")


def check_output(out: str | os.PathLike, sources: Iterable[tuple[str, str | os.PathLike]] = (), *,
                 label: str = "output", overwrite: bool = False) -> None:
    """UserError unless `out` may be written (module doc). `sources`: (what, path) pairs the command
    reads, e.g. ("model directory", MODEL); `label` names OUT in messages ("output", "-o")."""
    out = Path(out)
    shown = str(out) or repr("")
    own = _ident(out) if os.path.lexists(out) else None
    chain = levels(out)
    above = {i for p, i in chain if i != own}  # the existing ancestors of OUT
    cwd = levels(os.getcwd())
    if own is not None and own in {i for _, i in cwd}:
        what = "is the current directory" if own == cwd[0][1] else "contains the current directory"
        raise UserError(f"{label} {shown} {what} ({cwd[0][0]})",
                        hint="name a new directory for the artifact, e.g. -o ./model-nvfp4")
    for what, src in sources:
        src_chain = levels(src)
        if not src_chain or Path(os.path.realpath(src)) != src_chain[0][0]:
            continue  # a source that does not exist has nothing to protect
        sid = src_chain[0][1]
        if own == sid:
            raise UserError(f"{label} {shown} is the {what} {src_chain[0][0]}",
                            hint="write the artifact to a new directory, e.g. -o <model>-nvfp4")
        if own is not None and own in {i for _, i in src_chain}:
            raise UserError(f"{label} {shown} contains the {what} {src_chain[0][0]}; --overwrite would delete it",
                            hint="write the artifact to a new directory next to the model")
        if sid in above:
            raise UserError(f"{label} {shown} is inside the {what} {src_chain[0][0]}: writing there would "
                            "change or delete part of it", hint="write to a new directory outside the source")
    _check_cache(out, own, chain, label)
    if overwrite and own is not None:
        _check_mounts(out)


def check_in_place(artifact: str | os.PathLike, writes: str) -> None:
    """For the commands that write into an existing artifact (sign, tune): the artifact must not
    be, or lie inside, a Hugging Face cache. `writes`: the file written, for the message."""
    _check_cache(Path(artifact) / writes, None, levels(artifact), "writing")


__all__ = ["check_in_place", "check_output", "levels", "mount_points"]
