"""Performance benchmark: each measured value, its reference measured in the same run, and their ratio.

    largeprompt bench                # or: python -m largeprompt.bench
    largeprompt bench --paper        # the cost of the whole config/paper.yaml DAG on N cores

Each measurement runs in its own subprocess with one BLAS thread (so its peak RSS is its own) and takes the
median CPU time of interleaved rounds: a burst of load on a shared machine hits the value and its reference
alike. Targets are ratios, because machines differ:

* streaming attention ≥ 0.5× the two-pass BLAS floor and ≥ 1× torch SDPA, at a quarter of SDPA's memory;
* the engine's training step (L = 1000) ≤ 1.3× the floor of drawing the batch's Gaussians plus one pass over it
  with 2 runs, ≤ 2× with the 2 x (8 + 1) runs of config/paper.yaml, and no slower than the naive step; the
  stacked engine ≥ 1× the single-run engine in run·steps/s (L = 10 and 1000);
* the pipeline: default ≤ 10 min from empty, no-op ≤ 5 s, figure-only rerun ≤ 15 s (wall time);
* the cost of config/paper.yaml's training in core-hours, and with ``--paper`` of its whole DAG, each stage
  against its floor (the random numbers it draws; docs/performance.md#paper-floors).
"""
from __future__ import annotations

import argparse
import json
import os

import torch

from largeprompt.bench.attention import MEMORY_WORKERS, bench_attention
from largeprompt.bench.attention import worker as attention_worker
from largeprompt.bench.floors import sampler_seconds
from largeprompt.bench.memory import bench_memory, bench_paper_memory
from largeprompt.bench.paper import bench_paper, bench_paper_training
from largeprompt.bench.pipeline import bench_pipeline
from largeprompt.bench.slices import worker as stage_worker
from largeprompt.bench.training import bench_engines, bench_step
from largeprompt.bench.training import worker as training_worker
from largeprompt.io.runlog import keep_freed_memory


def worker(name: str, prompt_length: int, dim: int, n_queries: int, repeats: int, extra: dict) -> dict:
    """Run one measurement in this (fresh) process: 1 thread, allocator as in the pipeline's stages."""

    torch.set_num_threads(int(extra.get("threads", 1)))
    if name not in MEMORY_WORKERS:
        keep_freed_memory()  # as in every pipeline stage (runlog.run_stage); memory workers keep glibc's default
    if name == "sampler_rates":
        return sampler_seconds()
    if name.startswith("train_"):
        return training_worker(name, extra, repeats)
    if name.startswith("stage_"):
        return stage_worker(name, extra)

    return attention_worker(name, prompt_length, dim, n_queries, repeats, extra)


def run_benchmarks(quick: bool = False, pipeline: bool = True, pipeline_config: str | None = "config/smoke.yaml") -> int:
    """Print every bench line: attention, training, the paper training's cost and (unless skipped) the pipeline."""

    print(f"largeprompt bench — torch {torch.__version__}, {os.cpu_count()} CPUs, BLAS threads pinned to 1 per worker")
    sections = [bench_attention, bench_step, bench_engines, bench_paper_training]
    if pipeline:
        sections.append(lambda _quick: bench_pipeline(pipeline_config))
    for section in sections:
        for text in section(quick):
            print(text, flush=True)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="largeprompt bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--skip-pipeline", action="store_true")
    parser.add_argument("--pipeline-only", action="store_true", help="only the whole-pipeline timings")
    parser.add_argument("--pipeline-config", default="config/smoke.yaml",
                        help="config overlay for the pipeline timings; 'default' for config/config.yaml alone")
    parser.add_argument("--paper", action="store_true",
                        help="time a slice of each stage under config/paper.yaml and extrapolate its whole DAG")
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="cores for --paper (default: this machine's)")
    parser.add_argument("--memory", action="store_true",
                        help="peak RSS of every job of the pipeline (--pipeline-config) from empty, and its mem_mb")
    parser.add_argument("--paper-memory", action="store_true",
                        help="peak RSS of the stages whose memory grows with config/paper.yaml, at full size")
    parser.add_argument("--validate", action="store_true",
                        help="with --paper: also run full_model_flow and one training job (L = 100, ≈ 5 min) "
                             "at paper scale and compare them with their predictions")
    parser.add_argument("--save", metavar="JSON", help="with --paper: write every job's prediction to this file "
                        "(largeprompt publish compares it with a run's benchmark files)")
    for hidden, kind, default in (("--worker", str, None), ("--prompt-length", int, 0), ("--dim", int, 6),
                                  ("--queries", int, 64), ("--repeats", int, 5), ("--extra", str, "{}")):
        parser.add_argument(hidden, type=kind, default=default, help=argparse.SUPPRESS)
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        result = worker(args.worker, args.prompt_length, args.dim, args.queries, args.repeats, json.loads(args.extra))
        print(json.dumps(result))
        return 0
    config = None if args.pipeline_config == "default" else args.pipeline_config
    if args.paper:
        for text in bench_paper(args.cores, quick=args.quick, validate=args.validate, save=args.save):
            print(text, flush=True)
        return 0
    if args.memory or args.paper_memory:
        for text in bench_memory(config) if args.memory else bench_paper_memory():
            print(text, flush=True)
        return 0
    if args.pipeline_only:
        for text in bench_pipeline(config):
            print(text, flush=True)
        return 0
    return run_benchmarks(quick=args.quick, pipeline=not args.skip_pipeline, pipeline_config=config)
