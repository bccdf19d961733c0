# R2 at fixed queries: empirical quantiles of the finite-prompt error against the delta-method
# prediction and the rigorous finite-L bound (docs/experiments.md#fixed_query_bound).


rule simulate_fixed_query_bounds:
    output:
        result=results("bounds/fixed_query_bounds.parquet"),
    log:
        logs("bounds/simulate_fixed_query_bounds.log"),
    conda:
        ENV
    threads: config["threads_per_job"]
    resources:
        **gpu_request(),
        mem_mb=2200,  # measured: 1.4 GB peak, one block at paper size (L 2^18) x 1.5
        runtime=60,
    params:
        **code("simulate_fixed_query_bounds.py"),
        **cfg(
            "seed",
            "dtype",
            "bounds.chunk_size",
            "bounds.ci_level",
            "bounds.fixed_query",
        ),
    script:
        "../scripts/simulate_fixed_query_bounds.py"
