"""LLMCad's token tree (Xu et al., arXiv 2309.04255, Sec. 3.2-3.3): confidence branching, a branch pacer and an
adaptive verification trigger.

The draft grows one token per forward, as in the paper. The expanded node's top-1 token extends its branch; every
other candidate whose confidence (draft probability) is above branch_threshold starts a new branch, up to
max_children children per node. A branch owns the tokens it added since it forked, so the owned counts T_x sum to
the M draft tokens; its confidence C_x is the product of the confidences on its whole root-to-tip path. The pacer
extends the branch with the largest shortfall M * C_x / sum(C) - T_x from its confidence-proportional share
(max-min fairness; the paper's "min f" notation is read as raising the minimum, see the design notes B1.2).
Drafting stops, and the tree goes to verification, when the best branch's confidence T_c = max C_x falls below
alpha, or when the tree holds tree.budget nodes, root included.

alpha adapts after every verification from the most matching branch (the branch owning the last accepted node:
every branch through it matched equally far, and this one is the draft's top-1 continuation): it is multiplied by
alpha_decay (0.5) when that branch was accepted whole; otherwise Eq. (3) sets it to the branch's error fraction
(N_all - N_correct) / N_all, or the paper's prose rule divides it by the mean confidence of the branch's tokens from
the first wrong one on. alpha restarts at its initial value for every generation, and alpha_history records the
alpha each step was drafted under.

Candidates are the draft's top-k, also when drafting samples: which ones branch depends on their confidences, so
the tree records no draft distribution and rejection sampling treats its tokens as deterministic candidates.
"""

from __future__ import annotations

import math

from specbench.errors import SpecbenchError
from specbench.trees.policy import DraftExpander, GrowingTree, TreePolicy, draw_children
from specbench.trees.token_tree import TokenTree

ALPHA_RULES = ("eq3", "prose")


class LLMCadPolicy(TreePolicy):
    name = "llmcad"

    def __init__(self, budget: int = 16, branch_threshold: float = 0.3, max_children: int = 3, alpha: float = 0.01,
                 alpha_decay: float = 0.5, alpha_rule: str = "eq3") -> None:
        super().__init__(budget)
        for knob, value in (("branch_threshold", branch_threshold), ("alpha_decay", alpha_decay)):
            if not isinstance(value, (int, float)) or not 0 < value < 1:
                raise SpecbenchError(f"tree.{knob}={value!r} is invalid: it must lie strictly between 0 and 1")
        if not isinstance(alpha, (int, float)) or not 0 < alpha <= 1:
            raise SpecbenchError(f"tree.alpha={alpha!r} is invalid: the initial verification threshold must be in "
                                 f"(0, 1] (LLMCad's default: 0.01)")
        if not isinstance(max_children, int) or isinstance(max_children, bool) or max_children < 1:
            raise SpecbenchError(f"tree.max_children={max_children!r} is invalid: it must be an integer >= 1")
        if alpha_rule not in ALPHA_RULES:
            raise SpecbenchError(f"tree.alpha_rule='{alpha_rule}' is unknown; valid: eq3 (the paper's Eq. 3) or "
                                 f"prose (divide alpha by the mean confidence after the first error)")
        self.branch_threshold, self.max_children = branch_threshold, max_children
        self.alpha0, self.alpha_decay, self.alpha_rule = alpha, alpha_decay, alpha_rule
        self.reset()

    def reset(self) -> None:
        """A new generation: alpha back to its initial value, an empty history."""
        self.alpha = self.alpha0
        self.alpha_history: list[float] = []
        self._grown: GrowingTree | None = None

    def build(self, root: int, expander: DraftExpander) -> TokenTree:
        self.alpha_history.append(self.alpha)
        tree = GrowingTree.rooted(root)
        tips, owned = [0], [0]  # per branch: its unexpanded tip and how many tokens it added
        while len(tree.tokens) < self.budget:
            conf = [math.exp(tree.logp[t]) for t in tips]
            total, drafted = sum(conf), len(tree.tokens) - 1
            branch = max(range(len(tips)), key=lambda b: (drafted * conf[b] / total - owned[b], -b))
            tip = tips[branch]
            probs = expander.expand(tree, [tip])[0]
            top, *others = draw_children(probs, self.max_children)
            tips[branch] = tree.add(tip, top, math.log(max(float(probs[top]), 1e-30)))
            owned[branch] += 1
            for token in others:  # best first: stop at the first one at or below the threshold
                if float(probs[token]) <= self.branch_threshold or len(tree.tokens) >= self.budget:
                    break
                tips.append(tree.add(tip, token, math.log(float(probs[token]))))
                owned.append(1)
            if max(math.exp(tree.logp[t]) for t in tips) < self.alpha:
                break
        self._grown = tree
        return tree.freeze()

    def observe(self, tree: TokenTree, path: list[int]) -> None:
        """Update alpha from the verification of the last built tree (path: the accepted nodes, root first)."""
        grown = self._grown
        if grown is None or len(tree) != len(grown.tokens) or len(tree) == 1:
            return  # the decoder verified the root alone (no room in the context): no draft was checked
        first_child: dict[int, int] = {}
        for node in range(len(grown.tokens) - 1, 0, -1):  # the lowest id, i.e. the top-1 child, wins
            first_child[grown.parents[node]] = node
        tip = path[-1]
        while tip in first_child:
            tip = first_child[tip]
        branch, node = [], tip
        while node > 0:
            branch.append(node)
            node = grown.parents[node]
        n_correct, n_all = len(path) - 1, len(branch)
        wrong = [math.exp(grown.logp[n]) for n in branch if grown.depths[n] > n_correct]
        self.update(n_all, n_correct, wrong)

    def update(self, n_all: int, n_correct: int, after_error: list[float]) -> float:
        """The next alpha from the most matching branch: N_all tokens, N_correct accepted, and the cumulative
        confidences of its tokens from the first wrong one on (read by the prose rule only)."""
        if n_correct == n_all:
            self.alpha *= self.alpha_decay
        elif self.alpha_rule == "eq3":
            self.alpha = (n_all - n_correct) / n_all
        else:  # a threshold above 1 would verify after every draft token, as 1 already does
            self.alpha = min(1.0, self.alpha * len(after_error) / sum(after_error))
        return self.alpha
