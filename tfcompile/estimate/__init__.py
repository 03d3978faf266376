"""`tfcompile plan --estimate`: what a run needs and how long it takes, from config.json alone.

- shapes.py: the model on the meta device -> tensors, per-layer Linears and active parameters
- throughputs.py: device and node figures (sourced), this machine's measured throughputs
- cluster.py: `--devices` / `--nodes` -> the cluster, and its nodes' figures
- plan.py: output size (planned by the real select/quantize passes), memory per rank, disk,
  seconds per pass; report.py renders it
"""
