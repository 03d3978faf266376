"""`pack`: execute the program job by job and write the artifact, shard by shard.

Layout of the artifact (staging directory; the CLI renames it into place):
  config.json                  source config + compressed-tensors quantization_config
  model*.safetensors (+ index) compressed-tensors tensor names (vLLM, SGLang, transformers)
  tokenizer / generation files copied verbatim
  modelopt/                    with export=("modelopt",): the TensorRT-LLM view
Memory: one job (a fusion group) is resident at a time, plus at most 512 MiB
queued for the writer thread; source tensors are memory-mapped views whose
pages are released after each job. How and why: docs/design.md "Streaming".
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from tfcompile.artifact.configs import ct_quantization_config, modelopt_quant_config
from tfcompile.artifact.naming import modelopt_kv_name, modelopt_outputs, to_modelopt
from tfcompile.artifact.sink import ShardSink, after_all
from tfcompile.artifact.verify import SCALE_SUFFIXES, check_scale_tensor
from tfcompile.dist import LOCAL
from tfcompile.dist.devices import one_torch_thread
from tfcompile.dist.partition import shard_owner
from tfcompile.dist.stream import Plan, run_jobs
from tfcompile.io.aux_files import copy_aux_files
from tfcompile.io.checkpoint import Checkpoint
from tfcompile.io.hash_cache import sha256_files_cached
from tfcompile.io.hashing import sha256_file
from tfcompile.io.jsonfile import write_json
from tfcompile.io.writer import write_index
from tfcompile.ir import ArtifactInfo, Job, OutSpec, Program, execute
from tfcompile.kernels.formats import kernel_threads
from tfcompile.families.names import per_decoder_layer
from tfcompile.layout import artifact_files as layout_files
from tfcompile.layout.view import EngineView
from tfcompile.artifact.mixed_config import ct_mixed_config
from tfcompile.rotate import online
from tfcompile.pipeline.intents import ExtraViews, ShardSize
from tfcompile.pipeline.passes import PassResult, Unsupported, register_pass
from tfcompile.recipe import Recipe

EXPORTS = ("modelopt",)


@dataclass(frozen=True)
class PackConfig:
    max_shard_mb: float = 4096  # shard size limit in MiB (HF writes 5 GB shards)
    export: tuple[str, ...] = ()  # extra views: "modelopt"
    hash_cache: bool = True  # reuse source sha256 of unchanged files (tfcompile/io/hash_cache.py)


def _supports(recipe: Recipe, cfg: PackConfig) -> list[Unsupported]:
    reasons = []
    bad = [e for e in cfg.export if e not in EXPORTS]
    if bad:
        reasons.append(Unsupported(f"unknown export view(s) {bad}", "supported: " + ", ".join(EXPORTS)))
    if cfg.max_shard_mb <= 0:
        reasons.append(Unsupported("max_shard_mb must be positive"))
    return reasons


@register_pass("pack", config=PackConfig, requires=("source", "model", "plan", "program", "out_dir"),
               produces=("artifact",), supports=_supports,
               intents=lambda c: (ExtraViews(tuple(c.export)), ShardSize(c.max_shard_mb)))
def pack(ctx, cfg: PackConfig, reporter) -> PassResult:
    """Quantize job by job and stream the safetensors shards of every view."""
    out, program = Path(ctx.out_dir), ctx.program
    world = ctx.world or LOCAL  # under torchrun: each rank writes its shards (tfcompile/dist/stream.py)
    owned = (lambda i: shard_owner(i, world.size) == world.rank) if world.distributed else None
    hasher = _SourceHasher([f for i, f in enumerate(ctx.source.files) if i % world.size == world.rank],
                           cfg.hash_cache)
    limit = int(cfg.max_shard_mb * 1024 * 1024)
    sinks = {"": ShardSink(out, program.specs(), limit, owned=owned)}
    if "modelopt" in cfg.export:
        sinks["modelopt"] = ShardSink(out / "modelopt", _modelopt_specs(program), limit, "modelopt/", owned=owned)
    view = layout_files.open_view(ctx)  # the engine view OUT/<target>/ (tfcompile/layout/artifact_files.py), or None
    if view is not None:  # (one process only: tfcompile/pipeline/ranks.py refuses it after the layout pass)
        sinks[view.dir] = ShardSink(out / view.dir, view.specs(), limit, f"{view.dir}/")
    files: dict[str, str] = {}
    try:
        # Leave one core to the writer thread (measured: 2 kernel threads + the
        # writer on 2 vCPUs ran ~10% slower than 1 + the writer).
        with kernel_threads(max(1, torch.get_num_threads() - 1)), _torch_threads(program):
            stream = _stream if not world.distributed else _stream_ranks
            layers, bytes_in = stream(ctx, program, sinks, reporter, view)
        for sink in sinks.values():
            files.update(sink.close())
    except BaseException:
        for sink in sinks.values():
            sink.abort()  # stop writer threads before the staging dir is removed
        raise
    sources, bytes_out = hasher.result(), sinks[""].bytes_written
    if world.distributed:  # every rank's shards, figures and source hashes, in job order
        layers, files, sources, bytes_out = _merge_ranks(world, layers, files, sources, bytes_out)
    if world.is_root:  # config.json, index, tokenizer: written once
        files.update(_write_configs(out, ctx, cfg))
        files.update(layout_files.write_files(out, ctx, view, layers))  # view configs, kv_cache.json
        files.update(_write_indexes(sinks) if world.distributed else {})
        files.update(copy_aux_files(ctx.source.aux_files(), out))
        if "modelopt" in sinks:
            files.update({f"modelopt/{k}": v for k, v in copy_aux_files(ctx.source.aux_files(),
                                                                         out / "modelopt").items()})
    info = ArtifactInfo(out, dict(sorted(files.items())), sources, tuple(layers), bytes_in,
                        bytes_out, ("compressed-tensors",) + tuple(cfg.export)
                        + ((view.dir,) if view is not None else ()))
    ratio = bytes_in / max(info.bytes_out, 1)
    stats = {"files": len(files), "bytes_in": bytes_in, "bytes_out": info.bytes_out, "ratio": round(ratio, 3)}
    solve = per_decoder_layer({x["module"]: x["timing"]["solve_s"] for x in layers if "timing" in x})
    if solve:
        stats["solve_seconds_per_layer"] = solve
    return PassResult(ctx.with_(artifact=info), stats)


def _torch_threads(program: Program):
    """One torch intra-op thread while RTN streams: its torch work is small
    (group amax, 16 SQNR rows, scale rounding), and an OpenMP team spinning
    beside the writer thread on a busy core cost ~0.3 s per 4.5 GB model
    (measured: `layer_stats` 0.3-0.5 s -> 0.07 s). The solving and searching
    algorithms do their heavy work in torch and keep every thread."""
    return one_torch_thread(program.algorithm == "rtn")


def _stream(ctx, program: Program, sinks: dict[str, ShardSink], reporter,
            view: EngineView | None = None) -> tuple[list[dict], int]:
    """Execute every job in order, handing its outputs to the sinks."""
    layers, bytes_in = [], 0
    reporter.task(f"quantize ({program.algorithm}) + write", len(program.jobs))
    for job in program.jobs:
        tensors, stats = _job_tensors(job, program, ctx.source)
        bytes_in += _job_source_bytes(job, ctx.source)
        _put(sinks, job, program, tensors, view, ctx.source)
        layers.extend(stats)
        del tensors
        if job.source is not None:  # copied through: the writers read these pages later, drop them then
            after_all(sinks.values(), ctx.source.hand_off())
        else:
            ctx.source.release()  # RSS follows the jobs in hand, not the bytes read so far
        reporter.advance(1, job.group.key if job.group else job.source)
    return layers, bytes_in


def _job_tensors(job, program, source) -> tuple[dict, list[dict]]:
    """One job's output tensors and per-Linear figures; computed scales checked."""
    tensors, stats = execute(job, program, source)
    for spec in job.outputs:
        if job.source is None and spec.name.endswith(SCALE_SUFFIXES):  # computed, not copied
            check_scale_tensor(spec.name, tensors[spec.name])  # never ship a NaN/zero scale
    return tensors, stats


def _put(sinks, job, program, tensors, view=None, source=None) -> None:
    """Hand a job's tensors to every view's sink, in planned order."""
    for spec in job.outputs:
        sinks[""].put(spec.name, tensors[spec.name])
    if "modelopt" in sinks:
        for name, t in _job_modelopt(job, program, tensors):
            sinks["modelopt"].put(name, t)
    if view is not None:  # the engine view: gathered / fused rows, quantized here
        for name, t in view.tensors(job, tensors, source):
            sinks[view.dir].put(name, t)


def _stream_ranks(ctx, program, sinks, reporter, view=None) -> tuple[dict, int]:
    """_stream over the ranks: job i computed on one rank (the writer, or the rank holding what the
    group is computed from), its tensors delivered in order to the ranks owning its shards.
    Returns ({job: per-layer stats} of the jobs computed here, source bytes of every job)."""
    world, jobs = ctx.world, program.jobs
    where = {key: {s.name: shard_owner(i, world.size) for i, p in enumerate(sink.plans) for s in p.specs}
             for key, sink in sinks.items()}
    writers = [frozenset({where[""][o.name] for o in job.outputs}
                         | ({where["modelopt"][o.name] for o in _modelopt_job_specs(job, program)}
                            if "modelopt" in sinks else set())) for job in jobs]
    # a group whose statistic or solved codes one rank holds is computed there (Program.owner)
    compute = [program.owner(job.group.key) if job.group is not None else None for job in jobs]
    compute = tuple(min(w) if c is None else c for c, w in zip(compute, writers))
    specs = tuple(tuple((o.name, o.dtype, tuple(o.shape)) for o in job.outputs) for job in jobs)

    def run(i: int):
        out = _job_tensors(jobs[i], program, ctx.source)
        if world.rank not in writers[i]:
            ctx.source.release()  # (its outputs travel to the writer; deliver releases the others)
        return out

    def deliver(i: int, tensors: dict) -> None:
        _put(sinks, jobs[i], program, tensors)
        ctx.source.release()
        reporter.advance(1, jobs[i].group.key if jobs[i].group else jobs[i].source)

    reporter.task(f"quantize + write (rank {world.rank})", sum(world.rank in w for w in writers))
    extras = run_jobs(world, Plan(compute, tuple(writers), specs), run, deliver)
    return extras, sum(_job_source_bytes(job, ctx.source) for job in jobs)


def _merge_ranks(world, extras: dict, files: dict, sources: dict, nbytes: int):
    """(layers in job order, files, source hashes, bytes out) of the whole artifact, on every rank."""
    layers, all_files, all_sources, total = {}, {}, {}, 0
    for part in world.all_objects("pack/result", (extras, files, sources, nbytes)):
        layers.update(part[0])
        all_files.update(part[1])
        all_sources.update(part[2])
        total += part[3]
    return ([x for i in sorted(layers) for x in layers[i]], all_files, dict(sorted(all_sources.items())),
            total)


def _write_indexes(sinks) -> dict[str, str]:
    """model.safetensors.index.json of each sharded view (the per-rank sinks leave it to rank 0)."""
    out = {}
    for sink in sinks.values():
        index = write_index(sink.out_dir, sink.plans)
        if index is not None:
            out[sink.rel + index.name] = sha256_file(index)
    return out


def _job_source_bytes(job: Job, source: Checkpoint) -> int:
    if job.kind == "const":
        return 0  # computed by a pass, not read from the source
    if job.group is None:  # a copy (or one expert's slice of it), or an override standing in for it
        info = source.info(job.source)
        return info.nbytes * math.prod(job.outputs[0].shape) // max(math.prod(info.shape), 1)
    total = 0
    for name in {t.source for t in job.group.members}:
        info = source.info(name)
        members = [t for t in job.group.members if t.source == name]
        if members[0].expert is None:
            total += info.nbytes
        else:  # slices of a fused expert tensor: count the elements this job used
            total += sum(math.prod(t.shape) for t in members) * info.nbytes // math.prod(info.shape)
    return total


def _modelopt_specs(program: Program) -> list[OutSpec]:
    return [spec for job in program.jobs for spec in _modelopt_job_specs(job, program)]


def _modelopt_job_specs(job: Job, program: Program) -> list[OutSpec]:
    if job.kind == "const":  # KV scale: modelopt name, fp32 (0-d when per tensor)
        spec = job.outputs[0]
        shape = () if spec.shape == (1,) else spec.shape
        return [OutSpec(modelopt_kv_name(spec.name), torch.float32, shape)]
    if job.group is None:  # copies and overrides keep their source name and dtype
        return list(job.outputs)
    return [spec for t in job.group.members for spec in modelopt_outputs(program.scheme, t.module, *t.shape)]


def _job_modelopt(job: Job, program: Program, tensors: dict[str, torch.Tensor]):
    if job.kind == "const":
        spec = job.outputs[0]
        t = tensors[spec.name].float()
        yield modelopt_kv_name(spec.name), t.reshape(()) if spec.shape == (1,) else t
        return
    if job.group is None:  # a copy, its override or an expert's slice (same name in both views)
        name = job.outputs[0].name
        yield name, tensors[name]
        return
    for t in job.group.members:
        view = to_modelopt(program.scheme, t.module, tensors)
        for spec in modelopt_outputs(program.scheme, t.module, *t.shape):
            yield spec.name, view[spec.name]


def _write_configs(out: Path, ctx, cfg: PackConfig) -> dict[str, str]:
    """config.json for each view (+ hf_quant_config.json for modelopt); returns hashes."""
    base = {k: v for k, v in ctx.source.config.items() if k != "quantization_config"}
    ignore = list(ctx.plan.ignore)
    written = {}
    kv = ctx.program.kv_strategy
    if ctx.plan.mixed:  # mixed precision: a config group per scheme (tfcompile/artifact/mixed_config.py)
        ct = dict(base, quantization_config=ct_mixed_config(ctx.plan, ignore, kv, ctx.program.kv_format))
    else:
        ct = dict(base, quantization_config=ct_quantization_config(ctx.plan.scheme, ignore, kv,
                                                                   ctx.program.kv_format))
    if ctx.program.online_hadamard:  # the engine's x R (tfcompile/rotate/online.py); lm_head is never transformed
        ct["quantization_config"]["transform_config"] = online.transform_config(
            ctx.program.online_hadamard, sorted(set(ignore) | {"lm_head"}))
    written["config.json"] = write_json(out / "config.json", ct)
    if "modelopt" in cfg.export:
        hf_quant, mo_cfg = modelopt_quant_config(ctx.plan.scheme, ignore + list(ctx.plan.embeddings), kv,
                                                 ctx.program.kv_format)
        written["modelopt/config.json"] = write_json(out / "modelopt" / "config.json",
                                                     dict(base, quantization_config=mo_cfg))
        written["modelopt/hf_quant_config.json"] = write_json(out / "modelopt" / "hf_quant_config.json",
                                                              hf_quant)
    return written


class _SourceHasher:
    """sha256 of the source files on a background thread (overlaps quantization)."""

    def __init__(self, files: list[Path], use_cache: bool):
        self._out: dict[str, str] = {}
        self._err: list[BaseException] = []
        self._t = threading.Thread(target=self._run, args=(list(files), use_cache), daemon=True)
        self._t.start()

    def _run(self, files: list[Path], use_cache: bool) -> None:
        try:
            digests = sha256_files_cached(files, use_cache=use_cache)
            self._out.update({Path(f).name: d for f, d in digests.items()})
        except BaseException as e:  # noqa: BLE001 - surfaced in result()
            self._err.append(e)

    def result(self) -> dict[str, str]:
        self._t.join()
        if self._err:
            raise self._err[0]
        return dict(sorted(self._out.items()))


