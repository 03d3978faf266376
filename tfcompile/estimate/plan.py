"""`tfcompile plan MODEL --estimate`: output size, memory per rank, disk and time per pass.

From config.json alone (tfcompile/estimate/shapes.py). The output tensors are not guessed:
the select and quantize passes plan them on a stand-in checkpoint of the meta model's tensors,
so the artifact size is exact (tests check it against real artifacts). Memory and time follow
the pipeline's own structure (docs/distributed.md "Resource plan"); what the other passes will
do is read from the facts they promise (tfcompile/pipeline/intents.py: `CalibrationRun`,
`LayerSolve`, `ShardSize`, `EngineChecks`), and what the weight algorithm's solves cost from its
registration (`register_algorithm(cost=...)`, tfcompile/ir.py `SolveCost`): this module names no
algorithm (tests/test_algorithm_names.py).

- calibrate (layer by layer): per layer, read its weights (disk, once per node), copy them to
  the device, run this rank's batches (ceil(B/P) of B batches; 2 x active params + attention
  FLOPs per token, and 2 x tokens x K^2 per Hessian for X_b^T X_b), send those K x K partials
  to the groups' owners (network), which add them in batch order; a routed expert's rows go
  to its owner instead, which multiplies them (owners: per solve batch of experts). Memory: one
  layer + this rank's activations + one batch's temporaries + the Hessians it owns + one
  round's partials.
  With calibrate.propagate (not the default) an algorithm whose layer solver runs on request
  (`register_layer_solver(loop="propagate")`) and that has a solve cost also solves each layer
  there (the busiest rank's solves of that layer: the ranks meet at every layer), shares the
  quantized layer and runs it a second time (the forward alone); the spill then holds codes, not
  Hessians. One without a solve cost runs each layer a second time (its rounding not counted).
- pack: each rank reads, quantizes and writes its own shards (the slowest rank counts:
  whole shards go to ranks), streams overlapped; an algorithm with a solve cost, not
  propagating, adds each rank's solves (LPT assignment, as calibrate assigns them); the source
  hash runs beside it.
- the rest (load, select, quantize, manifest, verify) is metadata and small reads.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

from tfcompile.artifact.engines import check_engines, engine_record, plan_view
from tfcompile.calibration.record import CALIB
from tfcompile.dist.partition import hessian_owners, shard_owner
from tfcompile.io.writer import TensorSpec, plan_shards
from tfcompile.ir import ALGORITHMS, LAYER_SOLVERS, CalibStats, ModelInfo, SolveCost
from tfcompile.pipeline.context import Context
from tfcompile.pipeline.intents import (CalibrationRun, EngineChecks, KVCacheScales, LayerSolve, OnlineTransform,
                                        ScaleSearch, ShardSize,
                                        TrainsOnTheSource)
from tfcompile.pipeline.passes import REGISTRY, PassSpec, recipe_intent
from tfcompile.reporter import NullReporter
from tfcompile.families.experts import is_expert_group
from tfcompile.estimate.distill import distill_estimate
from tfcompile.estimate.shapes import ModelShape, model_shape
from tfcompile.estimate.cluster import GB, Cluster, fits, node_figures, parse_devices
from tfcompile.estimate.throughputs import ASSUMED, this_machine

@dataclass(frozen=True)
class Solves:
    """The weight algorithm's solves, as this module costs them (its registered `SolveCost`)."""
    key: str  # the passes' JSON field, "<algorithm>_solve_s"
    cost: SolveCost
    expert_batch: int  # routed experts per solve batch (quantize's, through `LayerSolve`)


def estimate(model: Path, recipe, devices: str = "cpu", nodes: int = 1) -> dict:
    """The resource plan as a JSON-ready dict (GB = 1e9 bytes, seconds)."""
    cluster = parse_devices(devices, nodes)
    shape = model_shape(model)
    program, plan = _program(shape, recipe)
    calib = recipe_intent(recipe, CalibrationRun)
    solve = recipe_intent(recipe, LayerSolve)  # the weight algorithm; none: the stand-in's (the default)
    algo = solve.algorithm if solve is not None else program.algorithm
    batch = solve.expert_batch if solve is not None else LayerSolve.expert_batch
    cost = getattr(ALGORITHMS.get(algo), "cost", None)
    solves = Solves(f"{algo}_solve_s", cost, batch) if cost is not None else None
    out_specs = program.specs()
    out_bytes = sum(math.prod(s.shape) * s.dtype.itemsize for s in out_specs)
    shard_mb = recipe_intent(recipe, ShardSize, ShardSize(4096)).max_mb
    hess = _hessian_groups(plan, shape, calib.hessian_blocks) if calib is not None and calib.hessian else {}
    owners = hessian_owners([g for g in plan.groups if g.key in hess], cluster.ranks, batch)  # as calibrate assigns them
    in_loop = _in_loop(calib, algo)
    propagate = bool(hess) and solves is not None and in_loop  # the layer loop solves, pack none
    passes = {}
    if calib is not None:
        passes["calibrate"] = _calibrate(shape, calib, cluster, hess, owners, solves if propagate else None,
                                         in_loop and solves is None)
    passes["pack"] = _pack(shape, out_specs, shard_mb, cluster, solves, {} if propagate else hess, owners)
    search = recipe_intent(recipe, ScaleSearch)
    if search is not None:  # on top of the stream: the search runs inside each job (its candidates on the cores)
        secs = _scale_search_s(plan, search, cluster)
        passes["pack"].update(seconds=round(passes["pack"]["seconds"] + secs, 2), scale_search_s=round(secs, 2))
    trains = recipe_intent(recipe, TrainsOnTheSource)
    if trains is not None and trains.settings is not None:  # memory per rank, DDP vs FSDP2 (estimate/distill.py)
        capacity = cluster.gpu.memory_gb if cluster.gpu else node_figures(cluster)["ram_gb"] / cluster.per_node
        passes[trains.by] = distill_estimate(shape, plan, trains.settings, cluster.ranks, capacity,
                                             cluster.gpu is not None)
    node = node_figures(cluster)
    doc = {
        "model": {"path": str(model), "architecture": (shape.config.get("architectures") or ["?"])[0],
                  "params": shape.params, "layers": len(shape.layers), "source_gb": round(shape.source_bytes / GB, 3),
                  "quantized_linears": len(plan.targets()), "groups": len(plan.groups)},
        "format": plan.scheme.name, "algorithm": algo,
        "cluster": {"devices": cluster.kind, "per_node": cluster.per_node, "nodes": cluster.nodes,
                    "ranks": cluster.ranks, "cpu_cores_per_rank": node["cores"] / cluster.per_node},
        "output_gb": round(out_bytes / GB, 3), "output_bytes": out_bytes,
        "disk": _disk(out_bytes, _spill(plan, hess, owners, cluster, propagate), propagate),
        "memory": _memory(passes, cluster, node),
        "passes": passes,
        "total_s": round(sum(p["seconds"] for p in passes.values()), 1),
    }
    checks = recipe_intent(recipe, EngineChecks)
    if checks is not None and checks.engines:  # what the engines would refuse, before any work
        kv = recipe_intent(recipe, KVCacheScales)
        online = recipe_intent(recipe, OnlineTransform)
        doc["engines"] = _engines(plan, checks, kv.kind if kv is not None else None,
                                  online.order if online is not None else 0)
    return doc


def _in_loop(calib: CalibrationRun | None, algorithm: str) -> bool:
    """calibrate.propagate, and the algorithm's layer solver runs on request: each layer is solved
    (or run again quantized) in the layer loop (calibration/propagate.py)."""
    spec = LAYER_SOLVERS.get(algorithm)
    return calib is not None and calib.propagate and spec is not None and spec.loop == "propagate"


def _spill(plan, hess: dict, owners: dict, cluster: Cluster, propagate: bool) -> float:
    """GB spilled by the busiest rank: the Hessians it owns, or (propagating) its groups' solved codes."""
    per_value = (lambda k: sum(hess[k][0]) * hess[k][1] * _code_bytes(plan.scheme)) if propagate \
        else (lambda k: 4 * hess[k][1] * hess[k][3])
    return max((sum(per_value(k) for k in hess if owners[k] == r) for r in range(cluster.ranks)),
               default=0) / GB


def _disk(out_bytes: int, spill: float, propagate: bool) -> dict:
    return {"output_gb": round(out_bytes / GB, 3), "hessian_spill_gb_per_rank": round(spill, 3),
            "spill_holds": "solved codes" if propagate else "hessians",
            "note": "OUT is staged beside itself (same file system) and renamed: no second copy"}


def _memory(passes: dict, cluster: Cluster, node: dict) -> dict:
    mem_host = max(p["host_gb"] for p in passes.values())
    mem_dev = max((p.get("device_gb", 0.0) for p in passes.values()), default=0.0)
    return {"host_gb_per_rank": round(mem_host, 3), "device_gb_per_rank": round(mem_dev, 3),
            "host_gb_per_node": round(mem_host * cluster.per_node, 3),
            "fits": fits(cluster, node, mem_host, mem_dev)}


def _engines(plan, checks: EngineChecks, kv_cache: str | None, online: int = 0) -> dict:
    """verify.engines (default vllm, sglang) at verify.engine_target / engine_tp, on the plan
    (tfcompile/artifact/engines.py: the rules quantize and `verify --engine` apply)."""
    problems = check_engines(plan_view(plan, kv_cache, online), checks.engines, target=checks.target, tp=checks.tp)
    return {"tp": checks.tp, "target": checks.target, **engine_record(problems, checks.engines)}


def _program(shape: ModelShape, recipe):
    """The passes that plan the quantized Linears and their output tensors (select, quantize: the
    first to produce `plan` and `program`) on a stand-in checkpoint of the model's tensors (the
    pass registry is filled by the caller: tfcompile.api, which the CLI imports)."""
    source = _MetaSource(shape)
    dominant = max(("BF16", "F16", "F32"), key=lambda c: sum(t.dtype == c for t in shape.tensors))
    ctx = Context(source_path=Path("."), out_dir=None, recipe=recipe, source=source,
                  model=ModelInfo.from_config(shape.config, dominant))
    planner = _maker("plan")
    ctx = planner.run(ctx, _config(planner, recipe), NullReporter()).ctx
    ctx = ctx.add(CALIB, CalibStats({t.module: 1.0 for t in ctx.plan.targets()}, 0, "estimate"))
    programmer = _maker("program")  # its defaults (round to nearest): every algorithm writes the same tensors
    return programmer.run(ctx, programmer.config(), NullReporter()).ctx.program, ctx.plan


def _maker(produced: str) -> PassSpec:
    """The registered pass that makes context field `produced` from nothing of its kind (not one
    that rewrites it, as mixed precision rewrites the plan)."""
    return next(s for s in REGISTRY.values() if produced in s.produces and produced not in s.requires)


def _config(spec: PassSpec, recipe):
    """The pass's config in the recipe, else its defaults for the recipe's format."""
    entry = next((e for e in recipe.passes if e.name == spec.name), None)
    if entry is not None:
        return entry.config
    takes_format = any(f.name == "format" for f in dataclasses.fields(spec.config))
    return spec.config(**({"format": recipe.format} if takes_format else {}))


class _MetaSource:
    """What select and quantize read of a checkpoint: names, dtypes and shapes (no data)."""

    def __init__(self, shape: ModelShape):
        self._t = {t.name: t for t in shape.tensors}
        self.config = shape.config

    def names(self):
        return list(self._t)

    def info(self, name: str):
        t = self._t[name]
        return type("Info", (), {"dtype": t.dtype if t.dtype != "F8_E4M3" else "BF16", "shape": t.shape,
                                 "nbytes": t.nbytes})()


def _hessian_groups(plan, shape: ModelShape, blocks: int = 0) -> dict[str, tuple[tuple[int, ...], int, float, int]]:
    """Group key -> (rows of each member, K, share of the layer's tokens it sees, columns of H kept
    per row: K, or `blocks` when only the diagonal blocks are recorded) for every group
    calibration records a Hessian for: every Linear group, and each routed expert's own (gate/up
    and down_proj: calibration/moe.py), which sees top-k / E of the tokens on average (the
    estimate assumes balanced routing, so every expert has enough tokens for its Hessian)."""
    routed = {layer.index: layer.routed for layer in shape.layers}
    out = {}
    for g in plan.groups:
        m = re.search(r"\.layers\.(\d+)\.", g.key)
        share = routed.get(int(m.group(1)), 1.0) if m and is_expert_group(g.key) else 1.0
        k = g.members[0].shape[1]
        out[g.key] = (tuple(t.shape[0] for t in g.members), k, share, blocks or k)
    return out


def _code_bytes(scheme) -> float:
    """Bytes per weight element of the packed codes, as the format states (FP4: two per byte; FP8: one)."""
    return scheme.weights.element_bits / 8


def _calibrate(shape: ModelShape, cfg: CalibrationRun, cl: Cluster, hess: dict, owners: dict,
               solves: Solves | None = None, rerun: bool = False) -> dict:
    """`solves` (None: not propagating): each layer is also solved in the loop (its busiest
    rank's solves: ranks wait for each other at every layer), its quantized weights shared (bf16,
    over the link) and run a second time (the forward alone). `rerun` (an algorithm without a
    solve cost, propagating): each layer run a second time, its rounding on every rank (not counted)."""
    node, gpu = node_figures(cl), cl.gpu
    batches = -(-cfg.samples // cfg.batch)
    rounds = -(-batches // cl.ranks)
    tokens_rank = rounds * cfg.batch * cfg.seq_len  # the busiest rank's tokens
    tokens = cfg.samples * cfg.seq_len
    cores = node["cores"] / cl.per_node
    M = this_machine()
    scale = cores / M["cpu_cores"]  # CPU figures are for the whole measured machine
    seconds, host, dev, solved = 0.0, 0.0, 0.0, 0.0
    for layer in shape.layers:
        heads, qk, v = layer.attn
        attn_ctx = cfg.seq_len / 2 if gpu else cfg.seq_len  # flash skips the causal half; CPU SDPA does not
        fwd = tokens_rank * (2 * layer.active + 2 * attn_ctx * heads * (qk + v))
        groups = [k for k in hess if re.search(rf"\.layers\.{layer.index}\.", k)]
        dense = [k for k in groups if not is_expert_group(k)]
        experts = [k for k in groups if is_expert_group(k)]
        if cl.ranks > 1:  # X_b^T X_b: a dense group's on the batch's rank, a routed expert's on its owner
            hflops = 2 * tokens_rank * sum(hess[k][1] * hess[k][3] for k in dense) + 2 * tokens * max(
                sum(hess[k][2] * hess[k][1] * hess[k][3] for k in experts if owners[k] == r) for r in range(cl.ranks))
        else:
            hflops = 2 * tokens_rank * sum(hess[k][2] * hess[k][1] * hess[k][3] for k in groups)  # routed rows
        # sent to the owners per round: a dense group's fp32 K x K partial, a routed expert's rows (bf16)
        partial = 4 * sum(hess[k][1] * hess[k][3] for k in dense) + \
            2 * cfg.batch * cfg.seq_len * sum(hess[k][2] * hess[k][1] for k in experts)
        replay = rounds * partial * (cl.ranks > 1)
        bf16 = layer.params * 2
        load = layer.source_bytes / node["read"] / GB
        if gpu:
            forward = fwd / (gpu.bf16_tflops * 1e12 * ASSUMED["gpu_forward_efficiency"])
            compute = forward + hflops / (gpu.fp32_tflops * 1e12 * ASSUMED["gpu_fp32_efficiency"])
            link = gpu.nvlink_gbps if cl.nodes == 1 else node["net"]
            load += bf16 / gpu.h2d_gbps / GB
        else:
            attn = tokens_rank * 2 * attn_ctx * heads * (qk + v)
            elementwise = tokens_rank * (4 * layer.hidden + 3 * layer.inter) * M["elementwise_ns"] / 1e9
            forward = (fwd - attn) / (M["bf16_gemm_gflops"] * 1e9 * scale) + \
                attn / (M["attn_gflops"] * 1e9 * scale) + elementwise / scale
            compute = forward + hflops / (M["fp32_gemm_gflops"] * 1e9 * scale)
            link = node["net"]
        net = replay / (link * GB * ASSUMED["link_efficiency"])
        seconds += load + compute + net + rounds * ASSUMED["sync_ms"] / 1e3 * (cl.ranks > 1)
        solve_mem = 0.0
        if solves is not None and groups:  # solve, share the quantized layer, run it again
            per = _solves_per_rank({k: hess[k] for k in groups}, owners, cl, M, solves)
            solve = max(per.values())
            shared = bf16 / (link * GB * ASSUMED["link_efficiency"]) * (cl.ranks > 1)
            seconds += solve + shared + forward
            solved += solve
            solve_mem = _solve_memory({k: hess[k] for k in groups}, solves)
        elif rerun:
            seconds += forward
        act = tokens_rank * layer.hidden * 2 * 2  # inputs kept for the next layer + this layer's outputs
        temps = cfg.batch * cfg.seq_len * (layer.inter * 2 + 3 * layer.hidden) * 2 + \
            cfg.batch * heads * cfg.seq_len * cfg.seq_len * 4 * (not gpu)  # CPU SDPA materialises scores
        owned = max((sum(hess[k][1] * hess[k][3] for k in groups if owners[k] == r) for r in range(cl.ranks)), default=0)
        hmem = 4 * owned + partial * (cl.ranks > 1)  # the sums it owns + this round's partials
        # a solve runs between the layer's two runs: the layer unbound, its Hessians and the activations kept
        if gpu:
            dev = max(dev, (bf16 + act + temps + hmem) / GB, (act + hmem + solve_mem) / GB)
            host = max(host, M["calibrate_rss_gb"] + layer.source_bytes / GB)
        else:
            host = max(host, M["calibrate_rss_gb"] + (act + hmem + max(layer.source_bytes + temps, solve_mem)) / GB)
    seconds += M["calibrate_setup_s"]  # CPU-side, whatever the device
    out = {"seconds": round(seconds, 2), "host_gb": round(host, 3), "tokens": tokens,
           "batches_per_rank": rounds, "note": "layer by layer; --calib self adds sampling the tokens on rank 0"}
    if solves is not None:
        out[solves.key] = round(solved, 2)
    if gpu:
        out["device_gb"] = round(dev, 3)
    return out


def _pack(shape: ModelShape, specs, shard_mb: float, cl: Cluster, solves: Solves | None, hess: dict,
          owners: dict) -> dict:
    node = node_figures(cl)
    shards = plan_shards([TensorSpec(s.name, s.dtype, tuple(s.shape)) for s in specs], int(shard_mb * 2 ** 20))
    out_share = max(sum(p.nbytes for i, p in enumerate(shards) if shard_owner(i, cl.ranks) == r)
                    for r in range(cl.ranks))
    total_out = sum(p.nbytes for p in shards)
    src = shape.source_bytes * out_share / max(total_out, 1)  # rounding: the writer quantizes its own shards
    cores = node["cores"] / cl.per_node
    m = this_machine()
    # the rank's pack as measured here end to end (quantize, write, hash), on its share of the
    # node's cores, unless its share of the node's disks is slower
    busy_per_node = min(cl.per_node, len(shards))
    # the pass's fixed cost (thread pools, writer, files; measured) + streaming its bytes
    stream = m["pack_setup_s"] + max(src / (node["read"] / busy_per_node), out_share / (node["write"] / busy_per_node),
                                     src / (m["pack_gbps"] * cores / m["cpu_cores"])) / GB
    solve, solve_mem = 0.0, 0.0
    if solves is not None and hess:
        solve = max(_solves_per_rank(hess, owners, cl, m, solves).values())
        solve_mem = _solve_memory(hess, solves) / GB
    # a job's mapped source (the largest tensor), its outputs and temporaries; the writer keeps up
    # with the quantizers (O_DIRECT at several times their rate), so its queue stays short. A
    # solve runs inside one job (a Linear of the layer, not the embedding): the larger of the two.
    largest = max(t.nbytes for t in shape.tensors)
    host = m["base_rss_gb"] + max(2.5 * largest / GB, 0.0 if cl.gpu else solve_mem)
    out = {"seconds": round(stream + solve, 2), "host_gb": round(host, 3),
           "shards": len(shards), "busiest_rank_output_gb": round(out_share / GB, 3),
           "stream_s": round(stream, 2)}
    if solves is not None:
        out[solves.key] = round(solve, 2)
        if cl.gpu:
            out["device_gb"] = round(solve_mem, 3)
    return out


def _scale_search_s(plan, search: ScaleSearch, cl: Cluster) -> float:
    """Seconds of quantize.scale_search=output per rank: every quantized weight scored under the
    candidate roundings the search counts for its format (`search.roundings`), at `scale_search_ns`
    per weight and rounding on one CPU thread (its measured figure; on a GPU run too: the search
    runs on the host), the candidates spread over the rank's cores. Ranks pack their own shards:
    an even share each."""
    cores = max(1, int(node_figures(cl)["cores"] // cl.per_node))
    seconds = 0.0
    for g in plan.groups:
        sets = search.roundings(plan.scheme_of(g).weights)
        threads = min(cores, sets)
        speed = threads * ASSUMED["search_thread_efficiency"] if threads > 1 else 1.0
        seconds += sets * sum(math.prod(t.shape) for t in g.members) / speed
    return seconds * this_machine()["scale_search_ns"] * 1e-9 / cl.ranks


def _solves_per_rank(hess: dict, owners: dict, cl: Cluster, m: dict, solves: Solves) -> dict[int, float]:
    """Rank -> seconds of the solves it owns among `hess` (one per member of each group)."""
    per: dict[int, float] = {}
    for k, (rows, kk, *_) in hess.items():
        together = _together(k, rows, solves)
        for n in rows:
            per[owners[k]] = per.get(owners[k], 0.0) + solves.cost.seconds(n, kk, cl.gpu, m, together)
    return per


def _together(key: str, rows: tuple[int, ...], solves: Solves) -> int:
    """Solves sharing one sweep and held at once: a batch of routed experts' members, if the
    algorithm batches them (`SolveCost.batches_experts`), else one."""
    return solves.expert_batch * len(rows) if solves.cost.batches_experts and is_expert_group(key) else 1


def _solve_memory(hess: dict, solves: Solves) -> float:
    """Bytes of the largest solve among `hess` (a batch of routed experts solves together)."""
    return max(solves.cost.peak_bytes(n, kk) * _together(k, rows, solves)
               for k, (rows, kk, *_) in hess.items() for n in rows)
