"""Hardware in two halves: `modelled` prices a forward on a board from its datasheet (specs, per-op roofline,
Ghidorah's partitions, LLMCad's streaming) and never runs a model; `measured` times this machine (its fingerprint,
peaks, L(n, context) per backend and dtype) and may price what it measured against the models, never the reverse."""
