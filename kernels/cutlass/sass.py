"""Read the SASS of a compiled kernel and check that its tensor-core MMA is really there.

Why: CUTLASS guards each arch-specific kernel body with the arch feature macros
(`__CUDA_ARCH_FEAT_SM90_ALL`, `__CUDA_ARCH_FEAT_SM100_ALL`). Compiled for `sm_100` (or
`sm_90`) without the `a`, the build succeeds and the kernel exists, but its body is a
printf + trap: the MMA is silently gone. So every build is disassembled
(`cuobjdump -sass`, ~1 s) and must contain one of the kernel's MMA opcodes
(CutlassKernel.mma):

  sm_90a FP8:    QGMMA.64xNx32.F32.E4M3.E4M3   (wgmma, e4m3 x e4m3 -> f32)
  sm_100a NVFP4: UTCOMMA.4X gdesc, gdesc, tmem, tmem, idesc, tmem
                 (tcgen05.mma kind::mxf4nvf4.block_scale.block16: A/B smem descriptors,
                 D, SFA and SFB in tensor memory; .4X = 4 scale factors per 64-wide K step)
  sm_100a MXFP4: UTCOMMA gdesc, gdesc, tmem, tmem, idesc, tmem   (kind::mxf4, block32)
  (nvdisasm 13.0 via cuobjdump -sass, measured on this project's builds)

A build without it fails emission with `MissingMmaError` naming the opcode and the arch
the SASS is for.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter

from tfcompile.errors import TfcompileError

_OPCODE = re.compile(r"\b([A-Z][A-Z0-9]*MMA)(\.[A-Za-z0-9_.]+)?")


class MissingMmaError(TfcompileError):
    """A compiled CUTLASS kernel has no tensor-core MMA in its SASS (built for the wrong arch)."""


def dump(cuobjdump: str, path: str) -> str:
    """`cuobjdump -sass` of a shared object / cubin / fatbin."""
    res = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise MissingMmaError(f"cuobjdump -sass {path} failed: {res.stderr.strip()[-300:]}",
                              hint="is the file a CUDA binary? rebuild with --set emit_cutlass.compile=always")
    return res.stdout


def archs(sass: str) -> list[str]:
    """The SASS targets in the dump (`arch = sm_90a` lines), sorted, without repeats."""
    return sorted(set(re.findall(r"arch = (sm_\w+)", sass)))


def mma_counts(sass: str) -> dict[str, int]:
    """Every MMA-like opcode with its modifiers (e.g. "QGMMA.64x128x32.F32.E4M3.E4M3") -> count."""
    counts: Counter = Counter()
    for line in sass.splitlines():
        if "/*" not in line:  # instruction lines look like "/*0a80*/  QGMMA.64x128x32... ;"
            continue
        for op, mods in _OPCODE.findall(line):
            counts[op + (mods or "")] += 1
    return dict(sorted(counts.items()))


def check(sass: str, wanted: tuple[str, ...], arch: str, what: str) -> dict:
    """The SASS evidence for one build: {"archs", "mma": {opcode: count}}; raises
    MissingMmaError when the code is not for sm_<arch> or none of the `wanted` opcode
    families (e.g. "QGMMA") appears in it."""
    found = mma_counts(sass)
    hits = {op: n for op, n in found.items() if op.split(".")[0] in wanted}
    targets = archs(sass)
    problems = []
    if f"sm_{arch}" not in targets:
        problems.append(f"the SASS is for {', '.join(targets) or 'no arch'}, not sm_{arch}")
    if not hits:
        problems.append(f"no {'/'.join(wanted)} instruction in it (MMA-like opcodes: "
                        f"{', '.join(sorted(found)) or 'none'}): the kernel body was compiled out")
    if problems:
        raise MissingMmaError(
            f"{what}: " + "; ".join(problems),
            hint=f"CUTLASS compiles arch-specific kernels to a trap without the 'a' suffix: build with "
                 f"-gencode arch=compute_{arch},code=sm_{arch}, not -arch=sm_{arch.rstrip('a')}")
    return {"archs": targets, "mma": hits}
