"""The cluster `plan --estimate` plans for (`--devices`, `--nodes`) and its nodes' figures
(tfcompile/estimate/throughputs.py: sourced device and node figures, this machine's measured ones)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tfcompile.errors import RecipeError
from tfcompile.estimate.throughputs import ACCELERATORS, NODES, this_machine

GB = 1e9
MAX_PER_NODE, MAX_RANKS = 1024, 1 << 16  # the estimate's per-rank tables stay small


@dataclass(frozen=True)
class Cluster:
    kind: str  # "cpu" or an ACCELERATORS key
    per_node: int  # ranks (GPUs) per node
    nodes: int

    @property
    def ranks(self) -> int:
        return self.per_node * self.nodes

    @property
    def gpu(self):
        return ACCELERATORS.get(self.kind)


def parse_devices(spec: str, nodes: int) -> Cluster:
    """'8xH200', 'H100', 'cpu', '2xcpu' (processes on this machine) -> Cluster."""
    m = re.fullmatch(r"(?:(\d+)x)?(\w+)", spec.strip())
    kind = m.group(2).upper() if m else ""
    kind = "cpu" if kind == "CPU" else kind
    if not m or (kind != "cpu" and kind not in ACCELERATORS) or nodes < 1:
        raise RecipeError(f"--devices {spec!r} / --nodes {nodes} is not understood",
                          hint="e.g. --devices 8xH200 --nodes 4 (devices: " + ", ".join(ACCELERATORS) +
                               ", or NxCPU: processes on this machine)")
    digits = m.group(1) or "1"
    per_node = int(digits) if len(digits) <= 18 else MAX_RANKS + 1  # no 10^5-digit int() from an option
    if not 1 <= per_node <= MAX_PER_NODE or nodes > MAX_RANKS or per_node * nodes > MAX_RANKS:
        raise RecipeError(f"--devices {spec!r} / --nodes {nodes}: {per_node} per node x {nodes} node(s) is outside "
                          f"1 to {MAX_PER_NODE} per node and {MAX_RANKS} ranks in all",
                          hint="e.g. --devices 8xH200 --nodes 4")
    return Cluster(kind, per_node, nodes)


def node_figures(cluster: Cluster) -> dict:
    """A node's cores, RAM (GB), disk read / write and network (GB/s): this machine's for `cpu`."""
    if cluster.kind == "cpu":
        m = this_machine()
        return {"cores": m["cpu_cores"], "ram_gb": m["ram_gb"], "read": m["read_gbps"], "write": m["write_gbps"],
                "net": m["gloo_gbps"]}
    n = NODES[cluster.kind]
    return {"cores": n.cpu_cores, "ram_gb": n.ram_gb, "read": n.disk_read_gbps, "write": n.disk_write_gbps,
            "net": n.network_gbps}


def fits(cluster: Cluster, node: dict, host: float, dev: float) -> dict:
    """Whether a node holds its ranks' host GB, and a GPU its rank's device GB."""
    out = {"host": host * cluster.per_node <= node["ram_gb"]}
    if cluster.gpu:
        out["device"] = dev <= cluster.gpu.memory_gb
    return out
