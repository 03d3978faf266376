"""Every TFCOMPILE_* environment variable and cache path, typed, in one place.

    from tfcompile.settings import settings
    settings().cache_dir / "sha256.json"

`settings()` reads the environment when called (so a test or a caller can change it
between runs); nothing else in tfcompile reads TFCOMPILE_* variables. The CLI's own
option variables (`TFCOMPILE_FORMAT`, `TFCOMPILE_RECIPE`) are listed in `CLI_ENV` and read
by click (docs/cli.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

# variable -> what it does (docs/cli.md "Environment" is generated from the same facts)
ENV = {
    "TFCOMPILE_CACHE": "cache root (default ~/.cache/tfcompile): source sha256 cache, built C "
                       "format kernels, CUTLASS builds",
    "TFCOMPILE_NO_NATIVE": "1: never build or load the fused C format kernels (the plain-torch "
                           "reference runs instead, bit-identical and slower)",
    "TFCOMPILE_NATIVE_ISA": "vector path the fused C format kernels are built for: native (default: "
                            "-march=native), avx512, avx2, neon or scalar; one this CPU lacks is an error",
    "TFCOMPILE_NVCC": "the nvcc used for CUTLASS kernels (default: nvcc on PATH, else "
                      "/usr/local/cuda/bin/nvcc)",
    "TFCOMPILE_PROGRESS_INTERVAL": "seconds between plain progress lines off a TTY (default 10; 0: "
                                   "every step)",
    "TFCOMPILE_PYTHON_DOC": "the python3.11-doc `_sources` folder of the default calibration and "
                            "evaluation text (default /usr/share/doc/python3.11/html/_sources)",
    "TFCOMPILE_KEY_PASSPHRASE": "passphrase of an encrypted signing key (--sign, tfcompile sign); "
                                "never logged",
    "TFCOMPILE_CHROMIUM": "the Chromium that renders report pages (screenshots, tests); default: "
                          "the first chromium on PATH",
    "TFCOMPILE_DIST_TIMEOUT": "under torchrun: seconds a rank waits for a peer (collectives, barriers, "
                              "rank 0's results) before failing the run (default 3600)",
    "TFCOMPILE_FAULT": "testing knob under torchrun: RANK:PASS:raise|kill fails that rank at the start "
                       "of PASS (docs/distributed.md)",
    "TFCOMPILE_THROUGHPUTS": "plan --estimate: a JSON file of this machine's measured throughputs in "
                             "place of the committed ones (`python bench/estimate.py --measure`)",
}
# Read by the test suite only (docs/ci.md): TFCOMPILE_ALLOW_SKIPS, TFCOMPILE_FAMILY_MATRIX,
# TFCOMPILE_FUZZ_EXAMPLES, TFCOMPILE_CUTLASS_TEST_CACHE.
DEFAULT_PROGRESS_INTERVAL_S = 10.0
DEFAULT_PYTHON_DOC = Path("/usr/share/doc/python3.11/html/_sources")
DEFAULT_DIST_TIMEOUT_S = 3600.0  # a slow rank writing a large shard is not a dead one
CLI_ENV = {
    "TFCOMPILE_FORMAT": "--format of quantize, distill and plan",
    "TFCOMPILE_RECIPE": "--recipe of quantize, distill and plan",
}


@dataclass(frozen=True)
class Settings:
    cache_dir: Path  # TFCOMPILE_CACHE
    no_native: bool  # TFCOMPILE_NO_NATIVE
    nvcc: str | None  # TFCOMPILE_NVCC
    native_isa: str = "native"  # TFCOMPILE_NATIVE_ISA (checked by kernels/formats/_native.py)
    progress_interval: float = DEFAULT_PROGRESS_INTERVAL_S  # TFCOMPILE_PROGRESS_INTERVAL, seconds >= 0
    python_doc: Path = DEFAULT_PYTHON_DOC  # TFCOMPILE_PYTHON_DOC
    key_passphrase: str | None = field(default=None, repr=False)  # TFCOMPILE_KEY_PASSPHRASE (a secret)
    chromium: str | None = None  # TFCOMPILE_CHROMIUM
    dist_timeout: float = DEFAULT_DIST_TIMEOUT_S  # TFCOMPILE_DIST_TIMEOUT, seconds
    fault: str = ""  # TFCOMPILE_FAULT, RANK:PASS:raise|kill (tests; PASS may be distill-step-K)
    throughputs: Path | None = None  # TFCOMPILE_THROUGHPUTS

    @property
    def sha256_cache(self) -> Path:
        """Remembered source digests (tfcompile/io/hash_cache.py)."""
        return self.cache_dir / "sha256.json"

    @property
    def native_kernels_dir(self) -> Path:
        """Built C format kernels (kernels/formats/_native.py)."""
        return self.cache_dir / "kernels"

    @property
    def cutlass_dir(self) -> Path:
        """Compiled CUTLASS objects by content hash (kernels/cutlass/build.py)."""
        return self.cache_dir / "cutlass"


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of `environ` (default: this process's environment, read now)."""
    env = os.environ if environ is None else environ
    cache = env.get("TFCOMPILE_CACHE") or Path.home() / ".cache" / "tfcompile"
    return Settings(cache_dir=Path(cache), no_native=bool(env.get("TFCOMPILE_NO_NATIVE")),
                    native_isa=(env.get("TFCOMPILE_NATIVE_ISA") or "native").strip().lower(),
                    nvcc=env.get("TFCOMPILE_NVCC") or None,
                    progress_interval=_seconds(env.get("TFCOMPILE_PROGRESS_INTERVAL"), DEFAULT_PROGRESS_INTERVAL_S),
                    python_doc=Path(env.get("TFCOMPILE_PYTHON_DOC") or DEFAULT_PYTHON_DOC),
                    key_passphrase=env.get("TFCOMPILE_KEY_PASSPHRASE") or None,
                    chromium=env.get("TFCOMPILE_CHROMIUM") or None,
                    dist_timeout=_seconds(env.get("TFCOMPILE_DIST_TIMEOUT"), DEFAULT_DIST_TIMEOUT_S),
                    fault=env.get("TFCOMPILE_FAULT", ""),
                    throughputs=Path(env["TFCOMPILE_THROUGHPUTS"]) if env.get("TFCOMPILE_THROUGHPUTS") else None)


def _seconds(raw: str | None, default: float) -> float:
    """A non-negative number of seconds; the default when unset or not a number."""
    try:
        return max(0.0, float(raw)) if raw is not None else default
    except ValueError:
        return default
