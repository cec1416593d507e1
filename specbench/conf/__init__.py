"""Hydra config groups (a package so `pkg://specbench.conf` and the installed command find them)."""
