# Stage 4: error-bound estimation (SPEC §3.1 stage 4), starting with the R1 Monte Carlo.


rule simulate_affine_limit:
    input:
        queries="results/data/queries.parquet",
    output:
        result="results/bounds/affine_limit.parquet",
    params:
        seed=cfg("seed"),
        dtype=cfg("dtype"),
        device=cfg("device"),
        measures=cfg("affine_limit", "measures"),
        gaussian_mean=cfg("affine_limit", "gaussian_mean"),
        gaussian_rho=cfg("affine_limit", "gaussian_rho"),
        attention_scale=cfg("affine_limit", "attention_scale"),
        prompt_lengths=cfg("affine_limit", "prompt_lengths"),
        n_prompts=cfg("affine_limit", "n_prompts"),
        chunk_size=cfg("affine_limit", "chunk_size"),
    log:
        "logs/bounds/simulate_affine_limit.log",
    threads: config["threads_per_job"]
    resources:
        mem_mb=2000,
        runtime=30,
    conda:
        ENV
    script:
        "../scripts/simulate_affine_limit.py"
