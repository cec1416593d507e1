"""The shared evaluator: plain decoding and method on the same prompts, metrics, lossless check, memory."""
