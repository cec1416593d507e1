"""What a target runs as, in one room: the Execution value and its label (value.py), the backends that run the
same transformers model with less overhead (backends.py), weight-only quantised linears (quantize.py, linears.py)
and the attention kernel by context length (attention.py). The models room loads models; the hardware room measures
executions (hardware/measured/machine_profile.py) and evaluation/precision.py chooses one from those measurements."""
