"""Prompt datasets (MT-Bench, HumanEval, GSM, ShareGPT, any JSONL) and how they become model inputs."""

from specbench.data.prompts import Prompt, PromptDataset, encode_conversation, encode_prompt

__all__ = ["Prompt", "PromptDataset", "encode_conversation", "encode_prompt"]
