# Stage 1: data generation (SPEC §3.1 stage 1).


rule make_queries:
    output:
        queries="results/data/queries.parquet",
    params:
        ray=cfg("affine_limit", "ray"),
    log:
        "logs/data/make_queries.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        ENV
    script:
        "../scripts/make_queries.py"
