# R2, R3 over random queries: how fast finite-prompt outputs and gradients approach the limit, one
# job per (token measure, tilt strength c), then the fitted rates
# (docs/experiments.md#output_concentration, docs/theory.md#random-query-rate).


rule simulate_errors:
    output:
        result=results("concentration/errors/{measure}/c{c}.parquet"),
    log:
        logs("concentration/simulate_errors/{measure}_c{c}.log"),
    wildcard_constraints:
        measure="gaussian|rademacher|uniform",
        c=r"[0-9.eE+-]+",
    conda:
        ENV
    threads: config["threads_per_job"]
    resources:
        **gpu_request(),
        mem_mb=2000,  # measured: 1.3 GB peak, one block at paper size (L 2^20) x 1.5
        runtime=60,
    params:
        **code("simulate_errors.py"),
        **cfg(
            "seed",
            "dtype",
            "bounds.dim",
            "bounds.log2_min_prompt_length",
            "bounds.log2_max_prompt_length",
            "bounds.points_per_octave",
            "bounds.n_repetitions",
            "bounds.repetition_block",
            "bounds.chunk_size",
        ),
        measure=lambda wildcards: wildcards.measure,
        c=lambda wildcards: float(wildcards.c),
    script:
        "../scripts/simulate_errors.py"


rule collect_errors:
    input:
        jobs=error_jobs(),
    output:
        output_errors=results("concentration/output_errors.parquet"),
        gradient_errors=results("concentration/gradient_errors.parquet"),
    log:
        logs("concentration/collect_errors.log"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=1100,  # measured: 0.7 GB peak at paper size (18M rows) x 1.5
        runtime=10,
    params:
        **code("collect_errors.py"),
    script:
        "../scripts/collect_errors.py"


rule estimate_rates:
    input:
        output_errors=results("concentration/output_errors.parquet"),
        gradient_errors=results("concentration/gradient_errors.parquet"),
    output:
        rates=results("concentration/rates.parquet"),
    log:
        logs("concentration/estimate_rates.log"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=1900,  # measured: 1.2 GB peak at paper size (18M rows) x 1.5
        runtime=20,
    params:
        **code("estimate_rates.py"),
        **cfg(
            "seed",
            "bounds.dim",
            "bounds.n_bootstrap",
            "bounds.ci_level",
            "bounds.paper_form_min_c",
        ),
    script:
        "../scripts/estimate_rates.py"
