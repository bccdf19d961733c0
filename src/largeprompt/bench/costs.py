"""Cost of each stage of a configuration's DAG, extrapolated from timed slices (``largeprompt bench --paper``).

Every stage is timed in CPU seconds on small slices of its work, at two sizes (w₁ < w₂) where its cost has a
fixed part, with the configuration's own params otherwise; seconds ≈ a + b·w is then evaluated at the
configuration's work. Each function returns the stage's jobs (:class:`~largeprompt.bench.schedule.Job`)
and a note saying what was timed.
"""
from __future__ import annotations

import copy
from pathlib import Path

from largeprompt.bench import floors
from largeprompt.bench.report import run_worker
from largeprompt.bench.schedule import Job, fit_linear, predict_linear
from largeprompt.icl.schedules import estimated_steps
from largeprompt.maths.concentration import prompt_length_grid


def with_values(config: dict, **dotted) -> dict:
    """A deep copy of ``config`` with the dotted keys set (``concentration__n_repetitions=250`` sets
    concentration.n_repetitions)."""
    out = copy.deepcopy(config)
    for key, value in dotted.items():
        node, *parents, last = out, *key.split("__")
        for part in parents:
            node = node[part]
        node[last] = value
    return out


SLICE_PEAKS: dict[str, float] = {}  # rule → the largest peak RSS (MB) of its timed slices in this process


def timed(rule: str, params: dict, folder: Path, inputs: dict | None = None) -> dict:
    """{"cpu": seconds, "rss_mb": peak, "drawn": {sampler: count}} of one ``stage_run`` worker; the peak is also kept
    in SLICE_PEAKS."""
    folder.mkdir(parents=True, exist_ok=True)
    out = run_worker("stage_run", rule=rule, inputs=inputs or {}, folder=str(folder), params=params)
    SLICE_PEAKS[rule] = max(SLICE_PEAKS.get(rule, 0.0), float(out["rss_mb"]))
    return out


def prepared(kind: str, folder: Path, **spec) -> dict:
    return run_worker("stage_prepare", kind=kind, folder=str(folder), spec=spec)


def _sliced(rule, config, folder, sizes, settings, inputs=None):
    """Fits of the stage's CPU seconds and of its floor (the numbers its slices drew, :mod:`largeprompt.bench.floors`)
    against the work sizes; ``settings(w)`` gives the dotted overrides at w.

    The smallest slice runs once untimed first: a stage's first run on a machine may tune its attention kernel
    (largeprompt.kernel.autotune), which would inflate the small slice and flatten the fitted slope.
    """
    timed(rule, with_values(config, **settings(min(sizes))), folder / f"{rule}_warmup", inputs)
    runs = [timed(rule, with_values(config, **settings(w)), folder / f"{rule}_{w}", inputs) for w in sizes]
    return fit_linear(sizes, [r["cpu"] for r in runs]), floors.floor_fit(sizes, runs)


def affine_limit(config, folder, quick) -> tuple[list[Job], str]:
    inputs = prepared("queries", folder / "queries", params=config)
    sizes = [2, 6] if quick else [4, 12]
    fit, floor = _sliced("simulate_affine_limit", config, folder, sizes, lambda w: {"affine_limit__n_prompts": w}, inputs)
    n = config["affine_limit"]["n_prompts"]
    return [Job("simulate_affine_limit", "affine_limit", predict_linear(fit, n), ("make_affine_limit_queries",),
                predict_linear(floor, n))], \
        f"n_prompts {sizes} → {n}"


def _block_slices(section: dict, prefix: str, quick: bool):
    """Slices of a streamed stage (config section ``section`` at dotted ``prefix``): one block of repetitions to
    L_max/4 and to L_max (``quick``: L_max/64 and L_max/16). Returns (block, [log₂ L_max], work sizes
    (repetitions x L_max), settings(work) for :func:`_sliced`)."""
    block, top = section["repetition_block"], section["log2_max_prompt_length"] - (4 if quick else 0)
    log2 = [top - 2, top]
    return block, log2, [block * 2**k for k in log2], \
        lambda w: {f"{prefix}__log2_max_prompt_length": (w // block).bit_length() - 1}


def concentration(config, folder, quick) -> tuple[list[Job], str]:
    """simulate_concentration_errors (one job per measure, every c on the same draws; cost ∝ repetitions × L_max),
    then collect and the rate tables.

    Each measure is timed on one block of repetitions (the config's repetition_block) at every c, to L_max/4 and
    to the paper's L_max: a job repeats that block, so its cost is extrapolated in repetitions only, and the larger
    slice's peak RSS is the job's (``--quick``: L_max/64 and L_max/16).
    """
    b = config["concentration"]
    block, log2, work, settings = _block_slices(b, "concentration", quick)
    paper_work = b["n_repetitions"] * 2 ** b["log2_max_prompt_length"]
    jobs = []
    for measure in b["token_measures"]:
        cfg = with_values(config, token_measure=measure, concentration__n_repetitions=block)
        fit, floor = _sliced("simulate_concentration_errors", cfg, folder / measure, work, settings)
        jobs.append(Job(f"simulate_concentration_errors {measure}", "simulate_concentration_errors",
                        predict_linear(fit, paper_work), floor=predict_linear(floor, paper_work)))
    collect, rates = _error_tables(config, folder, quick)
    jobs += [Job("collect_concentration_errors", "collect_concentration_errors", collect,
                 ("simulate_concentration_errors",)),
             Job("estimate_concentration_rates", "estimate_concentration_rates", rates, ("collect_concentration_errors",))]
    return jobs, (f"simulate_concentration_errors: {block} repetitions x {len(b['c_values'])} c x L_max = 2^{log2} → "
                  f"{b['n_repetitions']} x 2^{b['log2_max_prompt_length']}; collect {collect:.0f} s, rates {rates:.0f} s: "
                  "synthetic tables of 3 and 6 cells")


def _error_tables(config, folder, quick):
    """collect_concentration_errors and estimate_concentration_rates on synthetic tables of the paper's repetitions and L grid, for 3 and 6
    (measure, c) cells (estimate_concentration_rates reads one cell at a time: its cost is linear in the cells)."""
    b = config["concentration"]
    lengths = prompt_length_grid(b["log2_min_prompt_length"], b["log2_max_prompt_length"], b["points_per_octave"])
    every = [[m, float(c)] for m in b["token_measures"] for c in b["c_values"]]
    reps = b["n_repetitions"] // (10 if quick else 1)
    collect, rates, sizes = [], [], [3, 6]
    for n in sizes:
        jobs = prepared("errors", folder / f"errors_{n}", cells=every[:n], lengths=lengths, n_repetitions=reps)
        out = folder / f"collect_{n}"
        collect.append(timed("collect_concentration_errors", config, out, jobs)["cpu"])
        tables = {k: str(out / f"{k}.parquet") for k in ("output_errors", "gradient_errors")}
        rates.append(timed("estimate_concentration_rates", config, folder / f"rates_{n}", tables)["cpu"])
    scale = b["n_repetitions"] / reps
    return (scale * predict_linear(fit_linear(sizes, collect), len(every)),
            scale * predict_linear(fit_linear(sizes, rates), len(every)))


def fixed_query(config, folder, quick) -> tuple[list[Job], str]:
    """One block of repetitions to L_max/4 and to the paper's L_max, as in :func:`concentration`."""
    f = config["fixed_query_bound"]
    block, log2, work_sizes, settings = _block_slices(f, "fixed_query_bound", quick)
    cfg = with_values(config, fixed_query_bound__n_repetitions=block)
    fit, floor = _sliced("simulate_fixed_query_bound", cfg, folder, work_sizes, settings)
    work = f["n_repetitions"] * 2 ** f["log2_max_prompt_length"]
    return [Job("simulate_fixed_query_bound", "fixed_query_bound", predict_linear(fit, work),
                floor=predict_linear(floor, work))], \
        f"{block} repetitions x L_max = 2^{log2} → {f['n_repetitions']} x 2^{f['log2_max_prompt_length']}"


def flow_fit(config, folder, quick):
    """full_model_flow's CPU seconds against the horizon T, with flow points ∝ T (the ODE and one Hessian per point)."""
    horizon, points = config["train"]["horizon"], config["infinite"]["flow_points"]
    fractions = [1 / 16, 1 / 8] if quick else [1 / 4, 1 / 2]  # adaptive ODE steps: its cost is not linear in T
    sizes = [horizon * x for x in fractions]
    cfg = with_values(config, run_seed=config["train"]["seeds"][0])
    fit, _ = _sliced("full_model_flow", cfg, folder, sizes,  # an ODE: it draws nothing
                     lambda T: {"train__horizon": T, "infinite__flow_points": max(2, round(points * T / horizon))})
    return fit, sizes


def flows(config, folder, quick) -> tuple[list[Job], str]:
    """full_model_flow per seed, balanced_flow, reduced_model and summarize_trajectory_transfer."""
    fit, sizes = flow_fit(config, folder, quick)
    horizon = config["train"]["horizon"]
    jobs = [Job(f"full_model_flow seed={s}", "full_model_flow", predict_linear(fit, horizon))
            for s in config["train"]["seeds"]]
    alphas = config["infinite"]["balanced_flow"]["alphas"]
    bal, _ = _sliced("balanced_flow", config, folder, [1, 2],  # an ODE: it draws nothing
                     lambda n: {"infinite__balanced_flow__alphas": alphas[:n]})
    reduced = config["infinite"]["reduced_model"]
    seeds, steps = reduced["seeds"], reduced["steps"]
    cfg = with_values(config, infinite__reduced_model__seeds=seeds[:1])  # cost ∝ seeds x steps
    red, red_floor = _sliced("reduced_model", cfg, folder, [5, 10] if quick else [10, 20],
                     lambda n: {"infinite__reduced_model__steps": n})
    t = config["trajectory_transfer"]
    gap = len(t["seeds"]) * predict_linear(fit, t["horizon"])  # one flow per seed at the runs' logged times
    jobs += [Job("balanced_flow", "balanced_flow", predict_linear(bal, len(alphas))),
             Job("reduced_model", "reduced_model", len(seeds) * predict_linear(red, steps), (),
                 len(seeds) * predict_linear(red_floor, steps)),
             Job("summarize_trajectory_transfer", "summarize_trajectory_transfer", gap, ("train_trajectory_transfer", "reduced_model"))]
    return jobs, f"full_model_flow: horizon {[round(x, 3) for x in sizes]} → {horizon}; balanced_flow: 1, 2 starts " \
                 f"→ {len(alphas)}; reduced_model: 1 seed x {[10, 20]} steps → {len(seeds)} x {steps}"


def init_dependence(config, folder, quick) -> tuple[list[Job], str]:
    """simulate_init_dependence at 2 and 4 seeds (``quick``: 1 and 2), extrapolated in seeds; its summary is cheap."""
    sizes = [1, 2] if quick else [2, 4]
    fit, _ = _sliced("simulate_init_dependence", config, folder, sizes,  # flows of N inits: no draws
                     lambda n: {"init_dependence__n_seeds": n})
    n = config["init_dependence"]["n_seeds"]
    return [Job("simulate_init_dependence", "simulate_init_dependence", predict_linear(fit, n)),
            Job("summarize_init_dependence", "summarize_init_dependence", 0.0, ("simulate_init_dependence",))], \
        f"n_seeds {sizes} → {n}, horizon 2 x {config['init_dependence']['horizon']:g}"


def data(config, folder, quick) -> tuple[list[Job], str, float]:
    """make_icl_test_set, bayes_risk and a training job's reading of the test set, at two test-set sizes (∝ n_test).

    Also returns the seconds a training job spends reading the test set at the configuration's n_test.
    """
    longest = max(config["train"]["prompt_lengths"] + config["trajectory_transfer"]["prompt_lengths"])
    sizes = [100, 300] if quick else [400, 1200]
    cost = {"make_icl_test_set": [], "bayes_risk": [], "load_test_set": []}
    for n in sizes:
        cfg = with_values(config, icl__n_test=n, max_prompt_length=longest, prompt_length=longest)
        test_set = {"test_set": str(folder / f"make_icl_test_set_{n}" / "test_set.parquet")}
        for rule in cost:
            inputs = None if rule == "make_icl_test_set" else test_set
            cost[rule].append(timed(rule, cfg, folder / f"{rule}_{n}", inputs))
    n = config["icl"]["n_test"]
    at = {rule: predict_linear(fit_linear(sizes, [r["cpu"] for r in runs]), n) for rule, runs in cost.items()}
    floor = predict_linear(floors.floor_fit(sizes, cost["make_icl_test_set"]), n)  # the only one of them that draws
    jobs = [Job("make_icl_test_set", "make_icl_test_set", at["make_icl_test_set"], (), floor),
            Job("bayes_risk", "bayes_risk", at["bayes_risk"], ("make_icl_test_set",)),
            Job("make_affine_limit_queries", "make_affine_limit_queries", 0.0)]
    return jobs, f"n_test {sizes} → {n} at L = {longest}", at["load_test_set"]


def training_jobs(section: dict, config: dict, costs: dict, stage: str, after=("make_icl_test_set",),
                  n_test: int | None = None, label: str = "") -> list[Job]:
    """One job per L: steps x step(L) + (n_log + 1) test-loss passes on n_test prompts (default: icl.n_test), from
    the fitted costs; ``label`` goes between the stage and L in the job names."""
    steps = estimated_steps(section.get("step_size_rule", "constant"), section["lr"], section["horizon"],
                            section.get("stability_fraction", 1.0), section.get("final_lr", float("inf")))
    scale = (n_test or config["icl"]["n_test"]) / costs["n_test"]
    return [Job(f"{stage} {label}L={L}", stage, steps * predict_linear(costs["step"], L)
                + (section["n_log"] + 1) * scale * predict_linear(costs["test"], L), after,
                steps * predict_linear(costs["floor"], L))  # the test set is read, not drawn: only the steps draw
            for L in section["prompt_lengths"]]


MAX_TIMED_BATCH = 8192  # larger batches are timed at this size; the per-token cost scales with the batch beyond it
# (8192 prompts of L = 1000 are 200-400 MB a batch, far past any cache: timed at 1024, the transfer runs' batch of
# 32 768 came out 40% cheaper than the paper run measured)
BURST_PROMPTS = 25 * 1024  # a batch above 1024 is timed in bursts of ≈ this many prompts (3 steps of 8192)


def engine_costs(section: dict, quick: bool, lengths=(10, 100, 1000), dtype: str = "float32", task: dict | None = None) -> dict:
    """Fitted a + b·L of the engine's step and of one test-loss pass (on n_test prompts) for ``section``'s runs.

    A batch above MAX_TIMED_BATCH is timed at that size and b scaled by batch / MAX_TIMED_BATCH (a step costs
    a fixed part plus a part ∝ batch x L). Large batches are timed in shorter bursts and fewer rounds.
    """
    runs = (section["models"], section["seeds"], section["replicate_seeds"])
    n_test, batch = 256 if quick else 1024, min(section["batch_size"], MAX_TIMED_BATCH)
    burst = 25 if batch <= 1024 else max(1, BURST_PROMPTS // batch)  # 25: training.STEP_BURST
    repeats = (5 if quick else 15) if batch <= 1024 else (3 if quick else 5)
    extra = {"task": task} if task else {}  # default: the §6 task
    out = run_worker("train_costs", repeats=repeats, lengths=list(lengths), n_test=n_test, runs=runs,
                     dtype=dtype, batch=batch, burst=burst, **extra)
    cpu, scale = out["cpu"], section["batch_size"] / batch
    a, b = fit_linear(lengths, [cpu[f"step{L}"] for L in lengths])
    floor = fit_linear(lengths, [floors.floor_seconds(out["drawn"][str(L)]) * scale for L in lengths])
    return {"step": (a, b * scale), "floor": floor,
            "test": fit_linear(lengths, [cpu[f"test{L}"] for L in lengths]), "n_test": n_test}


def beyond_task(config: dict, measure: str) -> dict:
    """The isotropic task of section beyond_gaussian with covariates of ``measure``, as a section ``icl``."""
    b = config["beyond_gaussian"]
    return {"dim": b["dim"], "covariance_rho": 0.0, "task_variance": b["task_variance"],
            "noise_variance": b["noise_variance"], "token_measure": measure}


def beyond_flow(config, folder, quick, measure) -> Job:
    """flow_beyond_gaussian of one measure: one seed's flow timed at T/4 and T/2 (``quick``: T/16, T/8), flow points
    ∝ T, extrapolated to T and multiplied by the seeds."""
    b = config["beyond_gaussian"]
    horizon, points, seeds = b["train"]["horizon"], b["flow_points"], b["train"]["seeds"]
    sizes = [horizon * x for x in ([1 / 16, 1 / 8] if quick else [1 / 4, 1 / 2])]
    cfg = with_values(config, token_measure=measure, beyond_gaussian__train__seeds=seeds[:1])
    fit, _ = _sliced("flow_beyond_gaussian", cfg, folder / measure, sizes,
                     lambda T: {"beyond_gaussian__train__horizon": T,
                                "beyond_gaussian__flow_points": max(2, round(points * T / horizon))})
    return Job(f"flow_beyond_gaussian measure={measure}", "flow_beyond_gaussian", len(seeds) * predict_linear(fit, horizon))


def beyond_training(config, quick, measure) -> tuple[list[Job], Job]:
    """One measure's R6 jobs (one per L) and its R4 job (every L in turn), from the engine's costs on its task."""
    b, task = config["beyond_gaussian"], beyond_task(config, measure)
    train = {**config["train"], **b["train"]}
    fit = engine_costs(train, quick, dtype=train["dtype"], task=task)
    r6 = training_jobs(train, config, fit, "train_beyond_gaussian", ("flow_beyond_gaussian",), b["n_test"],
                       f"measure={measure} ")
    transfer = {**config["trajectory_transfer"], **b["trajectory_transfer"], "dtype": "float64"}
    fit = engine_costs(transfer, quick, dtype="float64", task=task)
    rule = "train_trajectory_transfer_beyond_gaussian"
    r4 = training_jobs(transfer, config, fit, rule, (), b["n_test"])
    return r6, Job(f"{rule} measure={measure}", rule, sum(j.seconds for j in r4), floor=sum(j.floor for j in r4))


def beyond_gaussian(config, folder, quick) -> tuple[list[Job], str]:
    """Section beyond_gaussian: per token measure its flows, R6 jobs and R4 job (the gaussian flows always: every
    measure's linear runs read them), then the summary."""
    b = config["beyond_gaussian"]
    measures = b["token_measures"]
    jobs = [beyond_flow(config, folder, quick, m) for m in dict.fromkeys(["gaussian", *measures])]
    for measure in measures:
        r6, r4 = beyond_training(config, quick, measure)
        jobs += [*r6, r4]
    jobs.append(Job("summarize_beyond_gaussian", "summarize_beyond_gaussian", 0.0,
                    ("train_beyond_gaussian", "train_trajectory_transfer_beyond_gaussian")))
    t, r = b["train"], b["trajectory_transfer"]
    return jobs, (f"{len(measures)} measures, d = {b['dim']}: flows of 1 seed at T/4, T/2 → {len(t['seeds'])} seeds x "
                  f"T = {t['horizon']:g}; R6 and R4 steps timed on each measure's task (R6: L {t['prompt_lengths']}, "
                  f"R4: L {r['prompt_lengths']}, batch {r['batch_size']})")
