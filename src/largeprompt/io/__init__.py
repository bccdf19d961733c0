"""Plumbing: results on disk and the pipeline's bookkeeping; nothing here changes a number.

``parquet_io`` (atomic Parquet with provenance), ``provenance``, ``runlog`` (job logs, progress bars,
threads), ``pipeline`` (config values as Snakemake params, run paths), ``config`` (validation) and
``fingerprints`` (which code each rule depends on). Left out of every rule's code fingerprint
(docs/architecture.md#fingerprints). May import the layers below it.
"""
