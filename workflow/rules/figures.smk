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
