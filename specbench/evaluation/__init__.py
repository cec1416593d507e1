"""The shared evaluator: baseline and method on the same prompts, metrics, lossless check, memory."""
