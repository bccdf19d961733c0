# R2 at fixed queries (docs/experiments.md#fixed_query_bound): empirical quantiles of the finite-prompt error
# against the delta-method prediction and the rigorous finite-L bound. Config section `fixed_query_bound`.


rule simulate_fixed_query_bound:
    output:
        quantiles=results("fixed_query_bound/quantiles.parquet"),
    log:
        logs("fixed_query_bound/simulate_fixed_query_bound.log"),
    benchmark:
        benchmarks("simulate_fixed_query_bound.tsv")
    cache: SHARE
    conda:
        ENV
    threads: threads()
    resources:
        **gpu_request(),
        mem_mb=2200,  # measured: 1.4 GB peak, one block at paper size (L 2^18) x 1.5
        runtime=60,
    params:
        **code("simulate_fixed_query_bound.py"),
        **cfg("seed", "dtype", "fixed_query_bound"),
    script:
        "../scripts/simulate_fixed_query_bound.py"
