"""Medusa's typical acceptance (Sec. 2.3.1): keep candidates the target finds plausible enough, not exactly sampled.

A node is accepted when its parent was and the target gives its token p(x) > min(eps, delta * exp(-H(p))), with p the
target distribution at the parent after temperature/top-p/top-k and H its entropy (log(p + 1e-5), as Medusa's code).
The longest accepted path wins, ties going to the highest summed log p; the bonus token is the target's argmax there
(Medusa's "first token greedy"). At temperature 0 this is greedy decoding; above it the output is not the target's
sampling distribution, so the rule is lossy. `temperature` gives the plausibility test its own temperature, as
Medusa's evaluate_posterior takes one: under greedy sampling the run then decodes greedily except where a plausible
draft token is kept, which is how typical acceptance is compared with greedy decoding (experiments/quality).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from specbench.acceptance.base import Acceptance, AcceptanceRule
from specbench.sampling import SamplingParams
from specbench.errors import SpecbenchError
from specbench.trees.token_tree import TokenTree


class TypicalAcceptance(AcceptanceRule):
    name = "typical"
    lossless = False

    def __init__(self, eps: float = 0.09, delta: float = 0.3, temperature: float | None = None) -> None:
        if not 0 < eps <= 1:
            raise SpecbenchError(f"accept.eps={eps} is invalid: the hard threshold must lie in (0, 1]")
        if delta <= 0:
            raise SpecbenchError(f"accept.delta={delta} is invalid: the entropy threshold scale must be > 0")
        if temperature is not None and not temperature > 0:
            raise SpecbenchError(f"accept.temperature={temperature} is invalid: give a temperature > 0, or null for "
                                 f"the run's sampling temperature")
        self.eps, self.delta, self.temperature = eps, delta, temperature

    def accept(self, tree: TokenTree, logits: torch.Tensor, sampling: SamplingParams,
               generator: torch.Generator | None = None) -> Acceptance:
        posterior = sampling if self.temperature is None else replace(sampling, temperature=self.temperature)
        probs = posterior.probs(logits).cpu()
        entropy = -(probs * torch.log(probs + 1e-5)).sum(-1)
        threshold = torch.clamp(self.delta * torch.exp(-entropy), max=self.eps)
        parents = tree.parents.tolist()
        token_prob = probs[tree.parents.clamp_min(0), tree.tokens]  # p of each node's token at its parent
        plausible = (token_prob > threshold[tree.parents.clamp_min(0)]).tolist()
        log_prob = token_prob.clamp_min(1e-30).log().tolist()
        depths = tree.depths.tolist()
        accepted, score = [True] + [False] * (len(parents) - 1), [0.0] * len(parents)
        best = 0
        for node in range(1, len(parents)):  # parents come first, so their verdict is known
            parent = parents[node]
            if accepted[parent] and plausible[node]:
                accepted[node], score[node] = True, score[parent] + log_prob[node]
                if (depths[node], score[node]) > (depths[best], score[best]):
                    best = node
        return Acceptance(path=tree.path_to(best), next_token=int(logits[best].argmax()))
