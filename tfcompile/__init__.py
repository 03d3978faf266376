"""tfcompile: ahead-of-time compression and compilation of LLM checkpoints."""

import os as _os
import sys as _sys

__version__ = "0.1.0"


def _unshadow_checkout_root() -> None:
    """Drop a source checkout's root from sys.path.

    The checkout's top-level `kernels/` installs as `tfcompile.kernels`, but with the root on
    sys.path (`python -m ...` and `python -c` run from it put the cwd first) it also answers
    `import kernels`, the name of Hugging Face's `kernels` distribution, which transformers >= 5.25
    requires and imports from modeling_utils (`from kernels import CUDAProperties`): every model
    load then fails with an ImportError. Only a checkout (a pyproject.toml beside kernels/ and
    tfcompile/) is touched, never an installed site-packages directory; tfcompile itself and its
    mapped subpackages are found through the installed package's own finder or __path__.
    """
    root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    marks = ("pyproject.toml", _os.path.join("kernels", "__init__.py"), _os.path.join("passes", "__init__.py"))
    if not all(_os.path.isfile(_os.path.join(root, m)) for m in marks):
        return
    _sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != root]


_unshadow_checkout_root()
