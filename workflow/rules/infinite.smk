# Stage 3: infinite-prompt dynamics (docs/experiments.md#trajectory_transfer,
# docs/experiments.md#balanced_flow): gradient flows on closed-form risks.


rule full_model_flow:
    output:
        flow=results("infinite/full_model_seed{seed}.parquet"),
    log:
        logs("infinite/full_model_seed{seed}.log"),
    wildcard_constraints:
        seed=r"\d+",
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=700,  # measured: 0.4 GB peak at paper size x 1.5
        runtime=20,
    params:
        **code("full_model_flow.py"),
        **cfg(
            "seed",
            *ICL_TASK,
            "train.horizon",
            "infinite.rtol",
            "infinite.atol",
            "infinite.flow_points",
        ),
        run_seed=lambda w: int(w.seed),
    script:
        "../scripts/full_model_flow.py"


rule balanced_flow:
    output:
        flow=results("infinite/balanced_flow.parquet"),
    log:
        logs("infinite/balanced_flow.log"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=600,  # measured: 0.4 GB peak at paper size x 1.5
        runtime=5,
    params:
        **code("balanced_flow.py"),
        **cfg(
            "icl.dim",
            "icl.covariance_rho",
            "infinite.rtol",
            "infinite.atol",
            "infinite.balanced_flow",
        ),
    script:
        "../scripts/balanced_flow.py"


rule reduced_model:
    output:
        result=results("infinite/reduced_model.parquet"),
    log:
        logs("infinite/reduced_model.log"),
    conda:
        ENV
    threads: config["threads_per_job"]
    resources:
        mem_mb=3200,  # measured: 2.1 GB peak at paper size (batch 4096, L 2000) x 1.5
        runtime=10,
    params:
        **code("reduced_model.py"),
        **cfg("seed", "infinite.reduced_model"),
    script:
        "../scripts/reduced_model.py"


# sup_t ‖θ_L(t) − θ_∞(t)‖ of the R4 runs (flows integrated at their logged times), their SGD-noise
# floor, and the slopes over L (§6 model and reduced model).
rule trajectory_gap:
    input:
        trajectories=transfer_trajectories(),
        reduced=results("infinite/reduced_model.parquet"),
    output:
        gaps=results("infinite/trajectory_gaps.parquet"),
        slopes=results("infinite/trajectory_slopes.parquet"),
    log:
        logs("infinite/trajectory_gap.log"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=700,  # measured: 0.4 GB peak (default run; the flows dominate) x 1.5
        runtime=10,
    params:
        **code("trajectory_gap.py"),
        **cfg(
            "seed",
            *ICL_TASK,
            "infinite.rtol",
            "infinite.atol",
            "transfer.floor_factor",
            "transfer.lr",
        ),
    script:
        "../scripts/trajectory_gap.py"


# How often torch-default inits give a drifting R∞ flow, and what predicts it
# (docs/experiments.md#init_dependence): the flows of seeds 0 … n_seeds−1, each classified at T and 2T.
rule simulate_init_dependence:
    output:
        flows=results("init_dependence/flows.parquet"),
    log:
        logs("init_dependence/simulate_init_dependence.log"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=700,
        runtime=lambda w: 10 + config["init_dependence"]["n_seeds"] // 30,
    params:
        **code("simulate_init_dependence.py"),
        **cfg(
            "seed",
            *ICL_TASK,
            "init_dependence.n_seeds",
            "init_dependence.horizon",
            "infinite.rtol",
            "infinite.atol",
        ),
    script:
        "../scripts/simulate_init_dependence.py"


rule summarize_init_dependence:
    input:
        flows=results("init_dependence/flows.parquet"),
    output:
        classes=results("init_dependence/classes.parquet"),
        predictors=results("init_dependence/predictors.parquet"),
    log:
        logs("init_dependence/summarize_init_dependence.log"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    params:
        **code("summarize_init_dependence.py"),
        **cfg("init_dependence.n_folds"),
    script:
        "../scripts/summarize_init_dependence.py"
