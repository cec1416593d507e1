"""Where results go: the per-prompt record store, summary tables, plots and loggers (csv, W&B offline)."""
