"""Pipeline stages. Each is ``stage(inputs, outputs, params, rule)``: named input and output
paths, the rule's params (config values), and the rule name recorded in provenance. Snakemake
calls them through ``workflow/scripts/``; they can equally be called by hand."""
