"""Investigations whose conclusions are in docs/ (the `studies` group of bench/__main__.py): rerun
one to check its conclusion, as `python -m bench run NAME [ARGS]` (or `python -m bench.studies.NAME`)
from the repository root; they are not part of a release's figures. They import the suite's
helpers as the package's modules (`from bench.common import ...`), so a study runs as a module,
never as `python bench/studies/NAME.py` (no sys.path tricks).
"""
