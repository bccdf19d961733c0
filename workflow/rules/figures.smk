# Stage 5: figure rendering (SPEC §3.1 stage 5). One rule and one plotting module per figure;
# the module is an input, so editing it redraws exactly that figure.


rule plot_affine_limit:
    input:
        result="results/bounds/affine_limit.parquet",
        module="src/largeprompt/plots/affine_limit.py",
    output:
        pdf="figures/affine_limit.pdf",
        png=report("figures/affine_limit.png", caption="../report/affine_limit.rst", category="R1 affine limit"),
    log:
        "logs/figures/affine_limit.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        ENV
    script:
        "../scripts/plot_affine_limit.py"


rule plot_output_concentration:
    input:
        rates="results/bounds/rates.parquet",
        module="src/largeprompt/plots/output_concentration.py",
        helper="src/largeprompt/plots/concentration.py",
    output:
        pdf="figures/output_concentration.pdf",
        png=report(
            "figures/output_concentration.png",
            caption="../report/output_concentration.rst",
            category="R2-R3 concentration",
        ),
    log:
        "logs/figures/output_concentration.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        ENV
    script:
        "../scripts/plot_output_concentration.py"


rule plot_gradient_concentration:
    input:
        rates="results/bounds/rates.parquet",
        module="src/largeprompt/plots/gradient_concentration.py",
        helper="src/largeprompt/plots/concentration.py",
    output:
        pdf="figures/gradient_concentration.pdf",
        png=report(
            "figures/gradient_concentration.png",
            caption="../report/gradient_concentration.rst",
            category="R2-R3 concentration",
        ),
    log:
        "logs/figures/gradient_concentration.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        ENV
    script:
        "../scripts/plot_gradient_concentration.py"


rule plot_rate_exponent:
    input:
        rates="results/bounds/rates.parquet",
        module="src/largeprompt/plots/rate_exponent.py",
    output:
        pdf="figures/rate_exponent.pdf",
        png=report(
            "figures/rate_exponent.png",
            caption="../report/rate_exponent.rst",
            category="R2-R3 concentration",
        ),
    log:
        "logs/figures/rate_exponent.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        ENV
    script:
        "../scripts/plot_rate_exponent.py"


rule plot_fixed_query_bound:
    input:
        result="results/bounds/fixed_query_bounds.parquet",
        module="src/largeprompt/plots/fixed_query_bound.py",
    output:
        pdf="figures/fixed_query_bound.pdf",
        png=report(
            "figures/fixed_query_bound.png",
            caption="../report/fixed_query_bound.rst",
            category="R2-R3 concentration",
        ),
    log:
        "logs/figures/fixed_query_bound.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        ENV
    script:
        "../scripts/plot_fixed_query_bound.py"


rule plot_balanced_flow:
    input:
        flow="results/infinite/balanced_flow.parquet",
        module="src/largeprompt/plots/balanced_flow.py",
    output:
        pdf="figures/balanced_flow.pdf",
        png=report("figures/balanced_flow.png", caption="../report/balanced_flow.rst", category="R5 balanced flow"),
    log:
        "logs/figures/balanced_flow.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        ENV
    script:
        "../scripts/plot_balanced_flow.py"


rule plot_training_vs_prompt_length:
    input:
        summary="results/train/summary.parquet",
        bayes_risk="results/data/bayes_risk.parquet",
        module="src/largeprompt/plots/training_vs_prompt_length.py",
    output:
        pdf="figures/training_vs_prompt_length.pdf",
        png=report(
            "figures/training_vs_prompt_length.png",
            caption="../report/training_vs_prompt_length.rst",
            category="R6 training",
        ),
    params:
        noise_variance=cfg("icl", "noise_variance"),
    log:
        "logs/figures/training_vs_prompt_length.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        ENV
    script:
        "../scripts/plot_training_vs_prompt_length.py"


rule plot_trajectory_transfer:
    input:
        runs=training_runs(),
        flows=full_model_flows(),
        reduced="results/infinite/reduced_model.parquet",
        gap="results/infinite/trajectory_gap.parquet",
        module="src/largeprompt/plots/trajectory_transfer.py",
    output:
        pdf="figures/trajectory_transfer.pdf",
        png=report(
            "figures/trajectory_transfer.png",
            caption="../report/trajectory_transfer.rst",
            category="R4 trajectory transfer",
        ),
    params:
        horizon=cfg("infinite", "trajectory_horizon"),
        lr=cfg("train", "lr"),
    log:
        "logs/figures/trajectory_transfer.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        ENV
    script:
        "../scripts/plot_trajectory_transfer.py"

