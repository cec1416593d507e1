"""Tree verification and commit must reproduce sequential greedy decoding exactly (fp32)."""

import random

import torch
from transformers import DynamicCache

from specbench.acceptance import ExactAcceptance
from specbench.sampling import SamplingParams
from specbench.trees import TokenTree
from specbench.verification import commit_path, verify_tree


def random_tree(rng: random.Random, vocab: int, size: int, greedy_hint: list[int] | None = None) -> TokenTree:
    parents, tokens = [-1], [rng.randrange(vocab)]
    for i in range(1, size):
        parents.append(rng.randrange(i))
        tokens.append(rng.randrange(vocab))
    return TokenTree(torch.tensor(tokens), torch.tensor(parents))


def sequential_logits(model, prefix: list[int], path_tokens: list[int]) -> torch.Tensor:
    cache = DynamicCache()
    model(input_ids=torch.tensor([prefix]), past_key_values=cache, use_cache=True)
    rows = []
    for tok in path_tokens:
        rows.append(model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True).logits[0, -1])
    return torch.stack(rows)


@torch.inference_mode()
def test_every_tree_node_gets_the_logits_of_its_path_decoded_sequentially(tiny):
    model, vocab = tiny.model, tiny.model.config.vocab_size
    rng = random.Random(0)
    for trial in range(12):
        prefix = [rng.randrange(vocab) for _ in range(rng.randint(1, 20))]
        tree = random_tree(rng, vocab, rng.randint(2, 12))
        cache = DynamicCache()
        model(input_ids=torch.tensor([prefix]), past_key_values=cache, use_cache=True)
        logits = verify_tree(model, cache, tree).logits
        for node in range(len(tree)):
            path = tree.path_to(node)
            ref = sequential_logits(model, prefix, tree.tokens[path].tolist())[-1]
            assert torch.allclose(logits[node], ref, atol=1e-5), (trial, node)


@torch.inference_mode()
def test_exact_acceptance_and_commit_match_sequential_greedy_on_random_trees(tiny):
    """Property test: trees seeded with the greedy continuation so paths of depth > 1 get accepted, with random
    branches beside them; the accepted tokens and the committed cache must equal sequential greedy decoding."""
    model, vocab = tiny.model, tiny.model.config.vocab_size
    rng = random.Random(1)
    exact, greedy = ExactAcceptance(), SamplingParams()
    deep_accepts = 0
    for trial in range(25):
        prefix = [rng.randrange(vocab) for _ in range(rng.randint(2, 15))]
        # the true greedy continuation, 6 tokens
        ref_cache = DynamicCache()
        out = model(input_ids=torch.tensor([prefix]), past_key_values=ref_cache, use_cache=True)
        root = int(out.logits[0, -1].argmax())
        cont, tok = [], root
        for _ in range(6):
            tok = int(model(input_ids=torch.tensor([[tok]]), past_key_values=ref_cache).logits[0, -1].argmax())
            cont.append(tok)
        # a branching tree: a partial greedy chain with random siblings and random subtrees hanging off it
        tokens, parents = [root], [-1]
        chain_len = rng.randint(0, 5)
        node = 0
        for d in range(chain_len):
            for _ in range(rng.randint(0, 2)):
                tokens.append(rng.randrange(vocab)); parents.append(node)  # noqa: E702
            tokens.append(cont[d]); parents.append(node)  # noqa: E702
            node = len(tokens) - 1
        for _ in range(rng.randint(0, 4)):
            tokens.append(rng.randrange(vocab)); parents.append(rng.randrange(len(tokens) - 1))  # noqa: E702
        tree = TokenTree(torch.tensor(tokens), torch.tensor(parents))

        cache = DynamicCache()
        model(input_ids=torch.tensor([prefix]), past_key_values=cache, use_cache=True)
        past = cache.get_seq_length()
        vout = verify_tree(model, cache, tree)
        acc = exact.accept(tree, vout.logits, greedy)
        accepted = tree.tokens[acc.path[1:]].tolist() + [acc.next_token]
        assert accepted == cont[: len(accepted)], trial
        assert acc.accepted >= chain_len
        deep_accepts += acc.accepted >= 2
        commit_path(cache, past, acc.path)
        assert cache.get_seq_length() == past + len(acc.path)
        # the committed cache must continue exactly like the sequential one
        nxt = model(input_ids=torch.tensor([[acc.next_token]]), past_key_values=cache).logits[0, -1]
        seq = sequential_logits(model, prefix, [root] + accepted)[-1]
        assert torch.allclose(nxt, seq, atol=1e-5), trial
    assert deep_accepts >= 5  # the property was exercised on paths of depth > 1
