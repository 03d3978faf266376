"""Turn names found in a checkpoint into paths, trusting none of them.

A checkpoint is untrusted input: an index.json could name `../../etc/passwd`,
and a weight file could be a symlink to anywhere. Every file we open from a
model directory goes through `resolve_in_dir`:

- the name must be a plain file name (no separator, not absolute, not `..`);
- the file must exist and be a regular file once symlinks are followed;
- its resolved target must lie inside the model directory's resolved path, or
  inside `<repo>/blobs` when the directory is a Hugging Face cache snapshot
  (`<repo>/snapshots/<rev>/`), whose files are symlinks to `../../blobs/<hash>`.
"""

from __future__ import annotations

import os
from pathlib import Path

from tfcompile.errors import CheckpointError

# Weight file names of the Hugging Face layout (read by checkpoint.py, written by writer.py).
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def allowed_roots(model_dir: Path) -> tuple[Path, ...]:
    """Resolved directories that files of `model_dir` may point into."""
    real = model_dir.resolve()
    if real.parent.name == "snapshots":  # HF cache: <repo>/snapshots/<rev>/
        return (real, real.parent.parent / "blobs")
    return (real,)


def check_plain_name(name: object, *, source: Path, entry: str) -> str:
    """`name` as a plain file name, or CheckpointError naming `source` and `entry`."""
    bad = (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or "/" in name
        or "\\" in name
        or "\0" in name
        or os.path.isabs(name)
    )
    if bad:
        raise CheckpointError(
            f"{source}: entry {entry!r} points to {name!r}, which is not a plain file name in the model directory",
            hint="index files may only name files in the same directory; fix or regenerate the index",
        )
    return name  # type: ignore[return-value]


def resolve_in_dir(model_dir: Path, name: str, *, source: Path | None = None, entry: str | None = None) -> Path:
    """Return `model_dir / name` after checking it is a safe regular file.

    `source`/`entry` name the file and key that referenced `name` (an index
    entry), so the error can point at them.
    """
    path = model_dir / name
    # Errors read "<index>: entry 'x' points to 'f', which ..." or "<path> ...".
    ref = f"{source}: entry {entry!r} points to {name!r}, which" if source else str(path)
    if not os.path.lexists(path):
        raise CheckpointError(
            f"{ref} does not exist",
            hint="the checkpoint is incomplete; download the missing file",
        )
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError) as e:  # dangling symlink or a loop
        raise CheckpointError(f"{ref} is a broken symlink ({e})", hint="re-download the checkpoint") from e
    if not any(real.is_relative_to(root) for root in allowed_roots(model_dir)):
        raise CheckpointError(
            f"{ref} is a symlink to {real}, outside the model directory",
            hint="copy the file into the model directory instead of linking to it",
        )
    if not real.is_file():
        raise CheckpointError(f"{ref} is not a regular file", hint="remove it or replace it with the real file")
    return path
