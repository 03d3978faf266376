"""tfcompile's benchmarks: one runner (`python -m bench list`, `python -m bench run NAME [ARGS]`,
bench/__main__.py), each script in one group (`SUITE` there): performance, accuracy, peers,
studies; plus the helpers they share (common.py, heldout.py) and the peers' drivers, which run
in the peers' own virtual environments. Standard library only: the runner imports nothing else.
"""
