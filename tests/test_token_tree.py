import pytest
import torch

from specbench.errors import SpecbenchError
from specbench.trees import TokenTree
from specbench.verification import tree_attention_mask


def test_tree_derives_depths_mask_positions_and_paths():
    # root -> a, root -> b, a -> c
    tree = TokenTree(torch.tensor([10, 11, 12, 13]), torch.tensor([-1, 0, 0, 1]))
    assert tree.depths.tolist() == [0, 1, 1, 2]
    assert tree.position_ids(7).tolist() == [7, 8, 8, 9]
    assert tree.path_to(3) == [0, 1, 3]
    assert tree.children(0) == [1, 2]
    assert not tree.is_chain
    mask = tree_attention_mask(tree, past_len=2)[0, 0]
    assert mask.shape == (4, 6)
    assert mask[:, :2].all()  # everyone sees the cache
    assert mask[3, 2:].tolist() == [True, True, False, True]  # c sees root, a, itself; not its uncle b
    assert mask[2, 2:].tolist() == [True, False, True, False]


def test_chain_is_recognised():
    assert TokenTree.chain(5, [1, 2, 3]).is_chain
    assert TokenTree.chain(5, []).is_chain


@pytest.mark.parametrize("tokens, parents, fragment", [
    ([1, 2, 3], [-1, 2, 0], "comes at or after it"),
    ([1, 2, 3], [-1, 0, 7], "outside the valid range"),
    ([1, 2], [0, 0], "must be the root"),
    ([1, 2, 3], [-1, 0], "must match"),
    ([], [], "at least the root"),
])
def test_invalid_trees_are_refused_with_a_clear_error(tokens, parents, fragment):
    with pytest.raises(SpecbenchError, match=fragment):
        TokenTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))
