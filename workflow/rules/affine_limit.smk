# R1: finite-prompt attention along a query ray against the exact infinite-prompt limit, for three
# token measures (docs/experiments.md#affine_limit).


rule simulate_affine_limit:
    input:
        queries=results("data/queries.parquet"),
    output:
        result=results("affine_limit/affine_limit.parquet"),
    log:
        logs("affine_limit/simulate_affine_limit.log"),
    conda:
        ENV
    threads: config["threads_per_job"]
    resources:
        **gpu_request(),
        mem_mb=1100,  # measured: 0.7 GB peak at paper size (2000 prompts) x 1.5
        runtime=30,
    params:
        **code("simulate_affine_limit.py"),
        **cfg("seed", "dtype", "affine_limit"),
    script:
        "../scripts/simulate_affine_limit.py"
