"""One small plotting module per figure (SPEC §3.2). They read Parquet and draw; they compute nothing."""
