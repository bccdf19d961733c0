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


# R2/R3 (SPEC F4, F5): Monte Carlo errors of outputs and gradients, one job per (measure, c).
rule simulate_errors:
    output:
        result="results/bounds/errors/{measure}/c{c}.parquet",
    params:
        seed=config["seed"],
        dtype=config["dtype"],
        device=config["device"],
        measure=lambda wildcards: wildcards.measure,
        c=lambda wildcards: float(wildcards.c),
        dim=config["bounds"]["dim"],
        log2_min_prompt_length=config["bounds"]["log2_min_prompt_length"],
        log2_max_prompt_length=config["bounds"]["log2_max_prompt_length"],
        points_per_octave=config["bounds"]["points_per_octave"],
        n_repetitions=config["bounds"]["n_repetitions"],
        repetition_block=config["bounds"]["repetition_block"],
        chunk_size=config["bounds"]["chunk_size"],
    wildcard_constraints:
        measure="gaussian|rademacher|uniform",
        c=r"[0-9.eE+-]+",
    log:
        "logs/bounds/simulate_errors/{measure}_c{c}.log",
    threads: config["threads_per_job"]
    resources:
        mem_mb=1500,
        runtime=60,
    conda:
        ENV
    script:
        "../scripts/simulate_errors.py"


rule collect_errors:
    input:
        jobs=expand(
            "results/bounds/errors/{measure}/c{c}.parquet",
            measure=config["bounds"]["measures"],
            c=[f"{float(c):g}" for c in config["bounds"]["c_values"]],
        ),
    output:
        output_errors="results/bounds/output_errors.parquet",
        gradient_errors="results/bounds/gradient_errors.parquet",
    params:
        seed=config["seed"],
    log:
        "logs/bounds/collect_errors.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        ENV
    script:
        "../scripts/collect_errors.py"


rule estimate_rates:
    input:
        output_errors="results/bounds/output_errors.parquet",
        gradient_errors="results/bounds/gradient_errors.parquet",
    output:
        rates="results/bounds/rates.parquet",
    params:
        seed=config["seed"],
        dim=config["bounds"]["dim"],
        n_bootstrap=config["bounds"]["n_bootstrap"],
        ci_level=config["bounds"]["ci_level"],
        paper_form_min_c=config["bounds"]["paper_form_min_c"],
    log:
        "logs/bounds/estimate_rates.log",
    threads: 1
    resources:
        mem_mb=3000,
        runtime=20,
    conda:
        ENV
    script:
        "../scripts/estimate_rates.py"


# R2 (SPEC F2, F3; THEORY §D): fixed queries at several κ, empirical quantiles against the bounds.
rule simulate_fixed_query_bounds:
    output:
        result="results/bounds/fixed_query_bounds.parquet",
    params:
        seed=config["seed"],
        dtype=config["dtype"],
        device=config["device"],
        chunk_size=config["bounds"]["chunk_size"],
        ci_level=config["bounds"]["ci_level"],
        kappas=config["bounds"]["fixed_query"]["kappas"],
        rho=config["bounds"]["fixed_query"]["rho"],
        dim=config["bounds"]["fixed_query"]["dim"],
        log2_min_prompt_length=config["bounds"]["fixed_query"]["log2_min_prompt_length"],
        log2_max_prompt_length=config["bounds"]["fixed_query"]["log2_max_prompt_length"],
        n_repetitions=config["bounds"]["fixed_query"]["n_repetitions"],
        repetition_block=config["bounds"]["fixed_query"]["repetition_block"],
        deltas=config["bounds"]["fixed_query"]["deltas"],
        n_f2_draws=config["bounds"]["fixed_query"]["n_f2_draws"],
    log:
        "logs/bounds/simulate_fixed_query_bounds.log",
    threads: config["threads_per_job"]
    resources:
        mem_mb=1500,
        runtime=60,
    conda:
        ENV
    script:
        "../scripts/simulate_fixed_query_bounds.py"
