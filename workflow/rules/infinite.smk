# Stage 3: infinite-prompt dynamics (SPEC §3.1 stage 3): gradient flows on closed-form risks.


rule full_model_flow:
    output:
        flow="results/infinite/full_model_seed{seed}.parquet",
    params:
        run_seed=lambda w: int(w.seed),
        seed=cfg("seed"),
        icl=icl_task_settings(),
        train=train_clock(),
        infinite=ode_tolerances(),
    log:
        "logs/infinite/full_model_seed{seed}.log",
    wildcard_constraints:
        seed=r"\d+",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        ENV
    script:
        "../scripts/full_model_flow.py"


rule balanced_flow:
    output:
        flow="results/infinite/balanced_flow.parquet",
    params:
        icl=icl_task_settings(),
        balanced_flow=cfg("infinite", "balanced_flow"),
        infinite=ode_tolerances(),
    log:
        "logs/infinite/balanced_flow.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        ENV
    script:
        "../scripts/balanced_flow.py"


rule reduced_model:
    output:
        result="results/infinite/reduced_model.parquet",
    params:
        seed=cfg("seed"),
        reduced_model=cfg("infinite", "reduced_model"),
    log:
        "logs/infinite/reduced_model.log",
    threads: config["threads_per_job"]
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        ENV
    script:
        "../scripts/reduced_model.py"


rule trajectory_gap:
    input:
        runs=training_runs(),
        flows=full_model_flows(),
        reduced="results/infinite/reduced_model.parquet",
    output:
        result="results/infinite/trajectory_gap.parquet",
    params:
        horizon=cfg("infinite", "trajectory_horizon"),
    log:
        "logs/infinite/trajectory_gap.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        ENV
    script:
        "../scripts/trajectory_gap.py"
