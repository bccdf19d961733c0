"""largeprompt: softmax attention in the large-prompt regime (Boursier & Boyer, ICML 2026).

The maths lives in small modules named after the paper's objects: ``measures`` (token
measures and their CGFs), ``attention`` (finite, streaming and infinite-prompt attention),
``parquet_io`` (results with provenance), ``seeding`` (counter-based generators).
"""
__version__ = "0.1.0"
