import random

import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from specbench.drafters.pld import find_ngram_continuation


def test_ngram_match_agrees_with_transformers_prompt_lookup():
    rng = random.Random(0)
    for _ in range(200):
        seq = torch.tensor([[rng.randrange(6) for _ in range(rng.randint(2, 40))]])
        ngram, num = rng.randint(1, 4), rng.randint(1, 8)
        ref = PromptLookupCandidateGenerator(num_output_tokens=num, max_matching_ngram_size=ngram, max_length=10_000)
        cand, _ = ref.get_candidates(seq)
        expected = cand[0, seq.shape[1]:].tolist()
        assert find_ngram_continuation(seq[0], ngram, 1, num).tolist() == expected


def test_no_match_gives_an_empty_draft():
    assert find_ngram_continuation(torch.tensor([1, 2, 3, 4]), 3, 1, 5).numel() == 0
