# R2, R3 over random queries (docs/experiments.md#output_concentration, docs/theory.md#random-query-rate):
# how fast finite-prompt outputs and gradients approach the limit, one job per token measure (every tilt
# strength c on the same draws), then the error tables and the rate tables. Config section `concentration`.


rule simulate_concentration_errors:
    output:
        errors=results("concentration/errors/{token_measure}.parquet"),
    log:
        logs("concentration/simulate_concentration_errors/{token_measure}.log"),
    benchmark:
        benchmarks("simulate_concentration_errors/{token_measure}.tsv")
    wildcard_constraints:
        token_measure="gaussian|rademacher|uniform",
    cache: SHARE
    conda:
        ENV
    threads: threads()
    resources:
        **gpu_request(),
        mem_mb=2000,  # measured: 1.3 GB peak, one block at paper size (L 2^20) x 1.5
        runtime=60,
    params:
        **code("simulate_concentration_errors.py"),
        **cfg(
            "seed",
            "dtype",
            "concentration.dim",
            "concentration.c_values",
            "concentration.log2_min_prompt_length",
            "concentration.log2_max_prompt_length",
            "concentration.points_per_octave",
            "concentration.n_repetitions",
            "concentration.repetition_block",
            "concentration.chunk_size",
        ),
        token_measure=lambda wildcards: wildcards.token_measure,
    script:
        "../scripts/simulate_concentration_errors.py"


rule collect_concentration_errors:
    input:
        jobs=error_jobs(),
    output:
        multiext(
            results("concentration/"),
            output_errors="output_errors.parquet",
            gradient_errors="gradient_errors.parquet",
        ),
    log:
        logs("concentration/collect_concentration_errors.log"),
    benchmark:
        benchmarks("collect_concentration_errors.tsv")
    cache: SHARE
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=1100,  # measured: 0.7 GB peak at paper size (18M rows) x 1.5
        runtime=10,
    params:
        **code("collect_concentration_errors.py"),
    script:
        "../scripts/collect_concentration_errors.py"


rule estimate_concentration_rates:
    input:
        output_errors=results("concentration/output_errors.parquet"),
        gradient_errors=results("concentration/gradient_errors.parquet"),
    output:
        multiext(results("concentration/"), **{t: f"{t}.parquet" for t in RATE_TABLES}),
    log:
        logs("concentration/estimate_concentration_rates.log"),
    benchmark:
        benchmarks("estimate_concentration_rates.tsv")
    cache: SHARE
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=1900,  # measured: 1.2 GB peak at paper size (18M rows) x 1.5
        runtime=20,
    params:
        **code("estimate_concentration_rates.py"),
        **cfg(
            "seed",
            "concentration.dim",
            "concentration.n_bootstrap",
            "concentration.ci_level",
            "concentration.paper_form_min_c",
        ),
    script:
        "../scripts/estimate_concentration_rates.py"
