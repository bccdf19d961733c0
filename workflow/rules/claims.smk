# The run read as claims (docs/experiments.md#claims): one row per claim of the paper and of this project, each
# computed from the run's own summary tables, with its interval, prediction and verdict. Config: none of its own.
# write_numbers puts the ledger's numbers and a few figures' key numbers into figures/<run>/numbers.tex as LaTeX
# macros (docs/architecture.md#numbers), for a paper's text to cite the run.


localrules:
    evaluate_claims,
    write_numbers,


rule evaluate_claims:
    input:
        tables=claim_tables(),
    output:
        claims=results("claims/claims.parquet"),
    log:
        logs("claims/evaluate_claims.log"),
    benchmark:
        benchmarks("evaluate_claims.tsv")
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=1500,
        runtime=5,
    params:
        **code("evaluate_claims.py"),
        **cfg("seed"),
    script:
        "../scripts/evaluate_claims.py"


# The tables are those of largeprompt.ledger.numbers.FIGURE_NUMBERS (tests/test_numbers.py checks).
rule write_numbers:
    input:
        claims=results("claims/claims.parquet"),
        tables=[
            results("train/training_prompt_lengths.parquet"),
            results("trajectory_transfer/slopes.parquet"),
            results("concentration/exponents.parquet"),
        ],
    output:
        numbers=figures("numbers.tex"),
    log:
        logs("claims/write_numbers.log"),
    benchmark:
        benchmarks("write_numbers.tsv")
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        **code("write_numbers.py"),
        run=RUN,
    script:
        "../scripts/write_numbers.py"
