"""The engines users would deploy instead (transformers' generate, llama.cpp, OpenVINO GenAI), each decoding the
run's prompts beside its methods: registry.py names them and their modes, base.py is what an engine is, one module
per engine."""
