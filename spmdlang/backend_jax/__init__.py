"""jax backends: our shard_map module and the XLA-GSPMD baseline (emit), and running them (runner)."""
