# Stage 2: training at each prompt length (SPEC §3.1 stage 2). One job per (model, L, seed).
# The checkpoint lives outside the declared outputs, so it survives a killed (incomplete) job.


rule train:
    input:
        test_set="results/data/icl_test.parquet",
    output:
        trajectory="results/train/{model}/L{L}/seed{seed}.parquet",
    params:
        model=lambda w: w.model,
        prompt_length=lambda w: int(w.L),
        run_seed=lambda w: int(w.seed),
        seed=cfg("seed"),
        icl=icl_task_settings(),
        train=train_settings(),
        device=cfg("device"),
        checkpoint=lambda w: f"results/checkpoints/train/{w.model}/L{w.L}/seed{w.seed}.pt",
    log:
        "logs/train/{model}/L{L}/seed{seed}.log",
    wildcard_constraints:
        model="softmax|linear",
        L=r"\d+",
        seed=r"\d+",
    threads: config["threads_per_job"]
    resources:
        mem_mb=2000,
        runtime=train_runtime,
    conda:
        ENV
    script:
        "../scripts/train.py"


# Final test MSE per run and, per (model, L), mean and 95% CI over seeds against the Bayes risk.
rule summarize_training:
    input:
        runs=training_runs(),
        bayes_risk="results/data/bayes_risk.parquet",
    output:
        summary="results/train/summary.parquet",
    log:
        "logs/train/summarize_training.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        ENV
    script:
        "../scripts/summarize_training.py"
