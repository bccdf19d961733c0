# R1 (docs/experiments.md#affine_limit): finite-prompt attention along a query ray against the exact
# infinite-prompt limit, for three token measures. Config section `affine_limit`.


rule make_affine_limit_queries:
    output:
        queries=results("affine_limit/queries.parquet"),
    log:
        logs("affine_limit/make_affine_limit_queries.log"),
    benchmark:
        benchmarks("make_affine_limit_queries.tsv")
    cache: SHARE
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=500,  # measured: 0.3 GB peak (default run) x 1.5, at least 500
        runtime=5,
    params:
        **code("make_affine_limit_queries.py"),
        **cfg("affine_limit.ray"),
    script:
        "../scripts/make_affine_limit_queries.py"


rule simulate_affine_limit:
    input:
        queries=results("affine_limit/queries.parquet"),
    output:
        # multiext: Snakemake's between-run cache (--cache) stores a job of several outputs only so
        multiext(
            results("affine_limit/"),
            outputs="outputs.parquet",
            bands="bands.parquet",
            leading_coefficients="leading_coefficients.parquet",
        ),
    log:
        logs("affine_limit/simulate_affine_limit.log"),
    benchmark:
        benchmarks("simulate_affine_limit.tsv")
    cache: SHARE
    conda:
        ENV
    threads: threads()
    resources:
        **gpu_request(),
        mem_mb=1100,  # measured: 0.7 GB peak at paper size (2000 prompts) x 1.5
        runtime=30,
    params:
        **code("simulate_affine_limit.py"),
        **cfg(
            "seed",
            "dtype",
            "affine_limit.token_measures",
            "affine_limit.gaussian_mean",
            "affine_limit.gaussian_rho",
            "affine_limit.attention_scale",
            "affine_limit.prompt_lengths",
            "affine_limit.n_prompts",
            "affine_limit.chunk_size",
        ),
    script:
        "../scripts/simulate_affine_limit.py"
