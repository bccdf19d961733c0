# Figure rendering: one rule and one small plotting module per figure (plots only draw). The code a plot
# reaches is in its params, so editing a plotting module redraws exactly the figures that use it. Figures
# and summaries take seconds: they run on the machine that runs Snakemake, never through a cluster queue.


localrules:
    all,
    make_affine_limit_queries,
    summarize_training,
    summarize_init_dependence,
    plot_affine_limit,
    plot_output_concentration,
    plot_gradient_concentration,
    plot_rate_exponent,
    plot_fixed_query_bound,
    plot_balanced_flow,
    plot_training_vs_prompt_length,
    plot_init_dependence,
    plot_trajectory_transfer,
    summarize_beyond_gaussian,
    plot_beyond_gaussian,


rule plot_affine_limit:
    input:
        bands=results("affine_limit/bands.parquet"),
    output:
        pdf=figures("affine_limit.pdf"),
        png=report(
            figures("affine_limit.png"),
            caption="../report/affine_limit.rst",
            category="R1 affine limit",
        ),
    log:
        logs("figures/affine_limit.log"),
    benchmark:
        benchmarks("plot_affine_limit.tsv")
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=1400,  # measured: 0.9 GB peak at paper size x 1.5
        runtime=5,
    params:
        **code("plot_affine_limit.py"),
        run=RUN,
    script:
        "../scripts/plot_affine_limit.py"


rule plot_output_concentration:
    input:
        **{
            t: results(f"concentration/{t}.parquet")
            for t in (
                "error_statistics",
                "exponents",
                "rate_guides",
                "local_exponents",
            )
        },
    output:
        pdf=figures("output_concentration.pdf"),
        png=report(
            figures("output_concentration.png"),
            caption="../report/output_concentration.rst",
            category="R2-R3 concentration",
        ),
    log:
        logs("figures/output_concentration.log"),
    benchmark:
        benchmarks("plot_output_concentration.tsv")
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=700,  # measured: 0.45 GB peak (default run) x 1.5
        runtime=5,
    params:
        **code("plot_output_concentration.py"),
        run=RUN,
    script:
        "../scripts/plot_output_concentration.py"


rule plot_gradient_concentration:
    input:
        **{
            t: results(f"concentration/{t}.parquet")
            for t in (
                "error_statistics",
                "exponents",
                "rate_guides",
                "local_exponents",
            )
        },
    output:
        pdf=figures("gradient_concentration.pdf"),
        png=report(
            figures("gradient_concentration.png"),
            caption="../report/gradient_concentration.rst",
            category="R2-R3 concentration",
        ),
    log:
        logs("figures/gradient_concentration.log"),
    benchmark:
        benchmarks("plot_gradient_concentration.tsv")
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=800,  # measured: 0.5 GB peak (default run) x 1.5
        runtime=5,
    params:
        **code("plot_gradient_concentration.py"),
        run=RUN,
    script:
        "../scripts/plot_gradient_concentration.py"


rule plot_rate_exponent:
    input:
        **{
            t: results(f"concentration/{t}.parquet")
            for t in ("exponents", "exponent_curves", "paper_form_fits")
        },
    output:
        pdf=figures("rate_exponent.pdf"),
        png=report(
            figures("rate_exponent.png"),
            caption="../report/rate_exponent.rst",
            category="R2-R3 concentration",
        ),
    log:
        logs("figures/rate_exponent.log"),
    benchmark:
        benchmarks("plot_rate_exponent.tsv")
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=700,  # measured: 0.45 GB peak (default run) x 1.5
        runtime=5,
    params:
        **code("plot_rate_exponent.py"),
        run=RUN,
    script:
        "../scripts/plot_rate_exponent.py"


rule plot_fixed_query_bound:
    input:
        quantiles=results("fixed_query_bound/quantiles.parquet"),
    output:
        pdf=figures("fixed_query_bound.pdf"),
        png=report(
            figures("fixed_query_bound.png"),
            caption="../report/fixed_query_bound.rst",
            category="R2-R3 concentration",
        ),
    log:
        logs("figures/fixed_query_bound.log"),
    benchmark:
        benchmarks("plot_fixed_query_bound.tsv")
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=700,  # measured: 0.45 GB peak (default run) x 1.5
        runtime=5,
    params:
        **code("plot_fixed_query_bound.py"),
        run=RUN,
    script:
        "../scripts/plot_fixed_query_bound.py"


rule plot_balanced_flow:
    input:
        flow=results("infinite/balanced_flow.parquet"),
    output:
        pdf=figures("balanced_flow.pdf"),
        png=report(
            figures("balanced_flow.png"),
            caption="../report/balanced_flow.rst",
            category="R5 balanced flow",
        ),
    log:
        logs("figures/balanced_flow.log"),
    benchmark:
        benchmarks("plot_balanced_flow.tsv")
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=700,  # measured: 0.45 GB peak (default run) x 1.5
        runtime=5,
    params:
        **code("plot_balanced_flow.py"),
        run=RUN,
    script:
        "../scripts/plot_balanced_flow.py"


rule plot_training_vs_prompt_length:
    input:
        runs=results("train/training_runs.parquet"),
        summary=results("train/training_prompt_lengths.parquet"),
        bayes_risk=results("icl/bayes_risk.parquet"),
        init_classes=results("init_dependence/classes.parquet"),
    output:
        pdf=figures("training_vs_prompt_length.pdf"),
        png=report(
            figures("training_vs_prompt_length.png"),
            caption="../report/training_vs_prompt_length.rst",
            category="R6 training",
        ),
    log:
        logs("figures/training_vs_prompt_length.log"),
    benchmark:
        benchmarks("plot_training_vs_prompt_length.tsv")
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=700,  # measured: 0.45 GB peak (default run) x 1.5
        runtime=5,
    params:
        **code("plot_training_vs_prompt_length.py"),
        run=RUN,
    script:
        "../scripts/plot_training_vs_prompt_length.py"


rule plot_init_dependence:
    input:
        flows=results("init_dependence/flows.parquet"),
        classes=results("init_dependence/classes.parquet"),
        predictors=results("init_dependence/predictors.parquet"),
    output:
        pdf=figures("init_dependence.pdf"),
        png=report(
            figures("init_dependence.png"),
            caption="../report/init_dependence.rst",
            category="R6 training",
        ),
    log:
        logs("figures/init_dependence.log"),
    benchmark:
        benchmarks("plot_init_dependence.tsv")
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=700,  # measured: 0.45 GB peak (default run) x 1.5
        runtime=5,
    params:
        **code("plot_init_dependence.py"),
        run=RUN,
    script:
        "../scripts/plot_init_dependence.py"


rule plot_trajectory_transfer:
    input:
        trajectories=training_trajectories(),
        flows=full_model_flows(),
        gaps=results("trajectory_transfer/gaps.parquet"),
        slopes=results("trajectory_transfer/slopes.parquet"),
    output:
        pdf=figures("trajectory_transfer.pdf"),
        png=report(
            figures("trajectory_transfer.png"),
            caption="../report/trajectory_transfer.rst",
            category="R4 trajectory transfer",
        ),
    log:
        logs("figures/trajectory_transfer.log"),
    benchmark:
        benchmarks("plot_trajectory_transfer.tsv")
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=700,  # measured: 0.45 GB peak (default run) x 1.5
        runtime=5,
    params:
        **code("plot_trajectory_transfer.py"),
        run=RUN,
    script:
        "../scripts/plot_trajectory_transfer.py"


rule plot_beyond_gaussian:
    input:
        **{
            t: results(f"beyond_gaussian/{t}.parquet")
            for t in ("prompt_lengths", "gaps", "slopes", "optima", "scale_profiles")
        },
        flows=beyond_gaussian_flows(),
    output:
        pdf=figures("beyond_gaussian.pdf"),
        png=report(
            figures("beyond_gaussian.png"),
            caption="../report/beyond_gaussian.rst",
            category="R4 and R6 beyond Gaussian tokens",
        ),
    log:
        logs("figures/beyond_gaussian.log"),
    benchmark:
        benchmarks("plot_beyond_gaussian.tsv")
    conda:
        ENV
    threads: threads(compute=False)
    resources:
        mem_mb=700,
        runtime=5,
    params:
        **code("plot_beyond_gaussian.py"),
        run=RUN,
    script:
        "../scripts/plot_beyond_gaussian.py"
