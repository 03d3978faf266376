"""Non-weight files a checkpoint carries that an artifact copies verbatim.

Tokenizer, generation and processor files: engines load them from the same
directory as the weights, so the artifact must ship them byte for byte.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tfcompile.errors import UserError
from tfcompile.io.hashing import CHUNK_BYTES
from tfcompile.io.oserrors import write_error

AUX_FILE_NAMES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "added_tokens.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
)


def copy_aux_files(files: list[Path], dst_dir: str | os.PathLike) -> dict[str, str]:
    """Copy each file into `dst_dir` under its own name; return {name: hex sha256}.

    Symlinks are followed: the copy holds the contents, never a link. The hash
    is computed while copying (one read of each file). Names must be unique.
    """
    dst_dir = Path(dst_dir)
    hashes: dict[str, str] = {}
    for src in files:
        name = Path(src).name
        if name in hashes:
            raise ValueError(f"two auxiliary files are named {name!r}")
        hashes[name] = _copy_hashing(Path(src), dst_dir / name)
    return dict(sorted(hashes.items()))


def _copy_hashing(src: Path, dst: Path) -> str:
    h = hashlib.sha256()
    try:
        fin = open(src, "rb")
    except OSError as e:
        raise UserError(f"cannot read {src}: {e.strerror or e}", hint="check that the file is readable") from e
    with fin:
        try:
            with open(dst, "xb") as fout:
                while chunk := fin.read(CHUNK_BYTES):
                    h.update(chunk)
                    fout.write(chunk)
        except OSError as e:
            raise write_error(dst, e) from e
    return h.hexdigest()
