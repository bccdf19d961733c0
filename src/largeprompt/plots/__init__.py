"""One small plotting module per figure (docs/experiments.md#results). They read Parquet and draw; they compute nothing."""
