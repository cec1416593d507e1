"""One draft tree from several drafters: a lookup drafter's continuations (SSSD, suffix decoding) merged with another
drafter's candidates (PLD, EAGLE's head) under one node budget. Lookups win on repetitive text and a trained head on
open chat: the two kinds fail on different tokens, so one verify can check the best guesses of both.

Each source proposes its own tree (at the hybrid's tree.budget, unless its entry names a tree policy). Their union is
one trie (the same token under the same parent is one node), whose every node carries who proposed it: the set of
sources, and its best rank among its siblings in their trees (the order each source proposed them in). The verified
tree is the union's best tree.budget nodes, grown best first by a score that estimates the probability that the
target accepts the node,
    score(node) = score(parent) * rate(proposers, depth, rank)
where rate is the running acceptance of the nodes with those proposers at that depth and rank, given that their
parent was accepted. The proposers are part of the key because agreement is evidence: a token two sources propose is
accepted more often than one either proposes alone, and a source's rate where the other disagrees is lower than its
average. Rates never exceed 1, so a parent scores at least its children and the best-first tree keeps every ancestor.

The rates learn from the tokens: at each propose the tokens emitted since the last one (the accepted nodes and the
target's own token) are walked down the last union. Under greedy acceptance they are the target's choices, so the rates
learn what the target would have accepted of every proposal, nodes the budget left out included; a deterministic
candidate x is accepted exactly when the emitted token is x (probability p(x) when sampling). Learning from the
tokens rather than from observe() keeps a hybrid of token-only sources a token-only drafter: task=replay replays it
step for step without the target.

Lossless under exact and rejection acceptance: the merged tree carries no draft distribution, so every node is a
deterministic candidate (q one-hot at its token). Rejection sampling then tests a node's children in index order,
accepts child x with the residual target probability p(x) and zeroes x out of p on rejection
(acceptance/rejection.py), so the emitted token follows p whichever tokens were proposed, provided the proposal does
not depend on the verifier's random draws. A source that samples its candidates (EAGLE at temperature > 0) draws them
with its own generator, which keeps that condition; the q it recorded is dropped, because a merged node's children
come from several sources and no single q drew them all.
"""

from __future__ import annotations

import copy
import heapq
import inspect
from itertools import count

import numpy as np
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from specbench.config import build
from specbench.drafters.base import DecodeState, Drafter, DrafterCost, StepOutcome
from specbench.errors import SpecbenchError
from specbench.trees.native import NativePolicy
from specbench.trees.policy import TreePolicy
from specbench.trees.sized import check_sized, paying_size
from specbench.trees.token_tree import TokenTree


class Union:
    """The sources' trees as one trie: per node its token, parent, depth, children, and proposers (a bit per source)
    with its best rank among its siblings in their trees."""

    def __init__(self, root: int, trees: list[TokenTree]) -> None:
        self.tokens, self.parents, self.depths = [root], [-1], [0]
        self.proposers, self.ranks, self.children = [0], [0], [[]]
        index: dict[tuple[int, int], int] = {}
        for bit, tree in enumerate(trees):
            here = [0]  # the tree's node -> its union node
            seen = [0] * len(tree)  # children of each tree node met so far: the next one's rank
            for token, parent in zip(tree.tokens.tolist()[1:], tree.parents.tolist()[1:]):
                rank, seen[parent] = seen[parent], seen[parent] + 1
                up = here[parent]
                node = index.get((up, token))
                if node is None:
                    node = index[(up, token)] = len(self.tokens)
                    self.tokens.append(token)
                    self.parents.append(up)
                    self.depths.append(self.depths[up] + 1)
                    self.proposers.append(0)
                    self.ranks.append(rank)
                    self.children.append([])
                    self.children[up].append(node)
                self.proposers[node] |= 1 << bit
                self.ranks[node] = min(self.ranks[node], rank)
                here.append(node)


class AcceptanceRates:
    """Acceptance by proposers (a bitmask of the sources), depth and rank: accepted / offered, where a node is offered
    when its parent was accepted (the root always is). A prior of `prior_weight` offers accepted at rate `prior` starts
    every cell; `decay` < 1 forgets old steps geometrically, so the rates follow the kind of text being written."""

    def __init__(self, sources: int, depths: int, ranks: int, prior: float, prior_weight: float,
                 decay: float) -> None:
        shape = (1 << sources, depths, ranks)
        self.accepted, self.offered = np.zeros(shape), np.zeros(shape)
        self.prior, self.prior_weight, self.decay = prior, prior_weight, decay

    def cell(self, proposers: int, depth: int, rank: int) -> tuple[int, int, int]:
        _, depths, ranks = self.offered.shape
        return proposers, min(depth, depths) - 1, min(rank, ranks - 1)

    def rate(self, proposers: int, depth: int, rank: int) -> float:
        cell = self.cell(proposers, depth, rank)
        return float((self.accepted[cell] + self.prior * self.prior_weight) / (self.offered[cell] + self.prior_weight))

    def table(self) -> np.ndarray:
        """(proposers, depths, ranks) of current rates."""
        return (self.accepted + self.prior * self.prior_weight) / (self.offered + self.prior_weight)

    def learn(self, union: Union, emitted: list[int]) -> None:
        """Walk the emitted tokens down the union: at each depth every child of the matched node was offered, the one
        spelling the next emitted token (if any) accepted."""
        self.accepted *= self.decay
        self.offered *= self.decay
        node = 0
        for token in emitted:
            matched = None
            for child in union.children[node]:
                cell = self.cell(union.proposers[child], union.depths[child], union.ranks[child])
                self.offered[cell] += 1
                if union.tokens[child] == token:
                    self.accepted[cell] += 1
                    matched = child
            if matched is None:
                return
            node = matched


def entries_of(drafters) -> dict:
    return OmegaConf.to_container(drafters, resolve=True) if isinstance(drafters, DictConfig) else drafters


class HybridDrafter(Drafter):
    """drafters: {name: {drafter: <a method's drafter config>, tree: <a tree config, or absent: native at the hybrid's
    budget>}}; at most one of them drafts from the target's outputs (EAGLE, Medusa), whose hooks the hybrid passes
    on."""

    name = "hybrid"
    tree_policies = ("native",)

    def __init__(self, target, tree: TreePolicy, drafters: dict, ranks: int = 4, prior: float = 0.5,
                 prior_weight: float = 2.0, decay: float = 1.0, sized: bool = False) -> None:
        """sized: trim each step's merged tree to the size that pays most on this machine (the run measures L(n) and
        calls fit): its scores are already the learned probabilities that a node is accepted."""
        entries = entries_of(drafters)
        self.check_config({"drafters": entries, "ranks": ranks, "prior": prior, "prior_weight": prior_weight,
                           "decay": decay, "sized": sized})
        self.budget, self.sized = tree.budget, sized
        self.step_ms: list[float] | None = None  # L(n) for n = 1..budget, once fit to this machine (sized only)
        self.sources: dict[str, Drafter] = {}
        for name, entry in entries.items():
            policy = build(entry["tree"]) if entry.get("tree") else NativePolicy(tree.budget)
            source = self.sources[name] = build(entry["drafter"], target=target, tree=policy)
            if source.verifier is not None:
                raise SpecbenchError(f"method.drafter.drafters.{name} ({type(source).__name__}) verifies with its own "
                                     f"model, not the run's target, which a merged tree cannot: pick another drafter")
        self.needs_hidden_states = self.model_source.needs_hidden_states if self.model_source else False
        # shared by the forks a batch makes (__copy__): every sequence's steps teach the same rates
        self.shape = (max(self.budget - 1, 1), ranks, prior, prior_weight, decay)
        self.forget()
        self._last: tuple[int, Union] | None = None

    @classmethod
    def check_config(cls, config: dict) -> None:
        """The entries' shape, the knobs' ranges and every source's class, tree and own knobs, before any model
        loads."""
        entries = entries_of(config["drafters"])
        if not isinstance(entries, dict) or len(entries) < 2 or not all(
                isinstance(e, dict) and "_target_" in (e.get("drafter") or {}) and set(e) <= {"drafter", "tree"}
                for e in entries.values()):
            raise SpecbenchError(f"method.drafter.drafters={entries!r} is invalid: give two or more entries "
                                 f"{{name: {{drafter: {{_target_: ..., knobs}}, tree: <optional tree config>}}}}")
        ranks = config["ranks"]
        if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
            raise SpecbenchError(f"method.drafter.ranks={ranks!r} is invalid: it must be an integer >= 1")
        for knob, low_open in (("prior", False), ("decay", True)):
            value = config[knob]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not (
                    0 < value <= 1 if low_open else 0 <= value <= 1):
                raise SpecbenchError(f"method.drafter.{knob}={value!r} is invalid: it must be a number in "
                                     f"{'(0, 1]' if low_open else '[0, 1]'}")
        check_sized(config.get("sized", False))
        weight = config["prior_weight"]
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight <= 0:
            raise SpecbenchError(f"method.drafter.prior_weight={weight!r} is invalid: it must be a number > 0")
        models = []
        for name, entry in entries.items():
            where, source = f"method.drafter.drafters.{name}", get_class(entry["drafter"]["_target_"])
            if cls.drafts_from_tokens and not source.drafts_from_tokens:
                raise SpecbenchError(f"{where} ({source.__name__}) drafts from the target's outputs, which "
                                     f"{cls.__name__} (a token-only drafter, so task=replay can replay it) cannot: "
                                     f"use {HybridDrafter.__module__}.HybridDrafter (method=hybrid_eagle)")
            policy = get_class(entry["tree"]["_target_"]).name if entry.get("tree") else NativePolicy.name
            if policy not in source.tree_policies:
                raise SpecbenchError(f"{where} ({source.__name__}) takes tree={', '.join(source.tree_policies)}, not "
                                     f"{policy}: give its entry a tree")
            if source.verify_extras is not Drafter.verify_extras:
                raise SpecbenchError(f"{where} ({source.__name__}) adds rows of its own to the verify, which a merged "
                                     f"tree cannot carry: pick another drafter")
            models += [name] if not source.drafts_from_tokens else []
            defaults = {key: p.default for key, p in inspect.signature(source).parameters.items()
                        if p.default is not inspect.Parameter.empty}
            source.check_config(defaults | {k: v for k, v in entry["drafter"].items() if not k.startswith("_")})
        if len(models) > 1:
            raise SpecbenchError(f"method.drafter.drafters {models} both draft from the target's outputs; at most one "
                                 f"may (each would add its own model's work to a step)")

    def forget(self) -> None:
        """Rates at their prior, and every source as built."""
        self.rates = AcceptanceRates(len(self.sources), *self.shape)
        for source in self.sources.values():
            source.forget()

    def __copy__(self) -> "HybridDrafter":
        """batching.fork_drafter copies a drafter shallowly per sequence of a batch; the sources hold per-generation
        state, so they are copied too, each with its tree policy as fork_drafter copies a drafter's."""
        fork = object.__new__(type(self))
        fork.__dict__.update(self.__dict__)
        fork.sources = {}
        for name, source in self.sources.items():
            forked = fork.sources[name] = copy.copy(source)
            for key, value in vars(source).items():
                if isinstance(value, TreePolicy):
                    setattr(forked, key, copy.copy(value))
        return fork

    @property
    def model_source(self) -> Drafter | None:
        """The one source that drafts from the target's outputs, if any: whose hooks the hybrid passes on."""
        return next((s for s in self.sources.values() if not s.drafts_from_tokens), None)

    def reset(self, state: DecodeState) -> None:
        self._last = None  # the prefill's token is no step of a tree
        for source in self.sources.values():
            source.reset(state)

    def propose(self, state: DecodeState) -> TokenTree:
        if self._last is not None:
            length, union = self._last
            self.rates.learn(union, state.tokens[length:])
        union = Union(state.root, [source.propose(state) for source in self.sources.values()])
        self._last = (len(state.tokens), union)
        return self.best(union)

    def best(self, union: Union) -> TokenTree:
        """The union's tree.budget best nodes by estimated acceptance, grown best first from the root; sized, the
        first of them that pay most on this machine's L(n) (trees.sized.paying_size)."""
        keep, heap, tie = [0], [], count()  # tie: equal scores pop in the union's order (the sources' order)

        def offer(node: int, score: float) -> None:
            for child in union.children[node]:
                p = score * self.rates.rate(union.proposers[child], union.depths[child], union.ranks[child])
                heapq.heappush(heap, (-p, next(tie), child))

        offer(0, 1.0)
        scores = []
        while heap and len(keep) < self.budget:
            neg, _, node = heapq.heappop(heap)
            keep.append(node)
            scores.append(-neg)
            offer(node, -neg)
        if self.step_ms is not None:
            keep = keep[: paying_size(scores, self.step_ms)]
        place = {node: i for i, node in enumerate(keep)}
        return TokenTree([union.tokens[n] for n in keep], [place[union.parents[n]] if n else -1 for n in keep])

    def observe(self, outcome: StepOutcome) -> None:
        """The sources see the merged tree's outcome (a model source re-feeds the accepted path's features); what the
        rates learn comes from the tokens (propose)."""
        for source in self.sources.values():
            source.observe(outcome)

    # the hooks of the one source that drafts from the target's outputs, if any

    def prefill_extras(self, prompt: TokenTree):
        return self.model_source.prefill_extras(prompt) if self.model_source else None

    def cost(self) -> DrafterCost:
        return self.model_source.cost() if self.model_source else DrafterCost()

    def on_backend(self, run_on) -> None:
        for source in self.sources.values():
            source.on_backend(run_on)

    def on_openvino(self) -> None:
        for source in self.sources.values():
            source.on_openvino()

    def compile_ahead(self, shortest: int, longest: int) -> None:
        for source in self.sources.values():
            source.compile_ahead(shortest, longest)

    def fit(self, latency_ms) -> None:
        if self.sized:
            self.step_ms = [latency_ms(n) for n in range(1, self.budget + 1)]
        for source in self.sources.values():
            source.fit(latency_ms)

    def cache_bytes(self) -> int:
        return sum(source.cache_bytes() for source in self.sources.values())

    def parameters_bytes(self) -> tuple[int, int]:
        sizes = [source.parameters_bytes() for source in self.sources.values()]
        return sum(p for p, _ in sizes), sum(b for _, b in sizes)


class TokenHybridDrafter(HybridDrafter):
    """A hybrid whose sources all draft from the tokens alone (SSSD, suffix decoding, PLD), and so does it: task=replay
    replays it. Whether a drafter can be replayed is read from its class before it is built, hence a class of its
    own. Its rates learn across answers, so the evaluator has it forget its untimed generations and relearn a resumed
    folder's answers, which it replays (Drafter.learns_across_answers); a hybrid with a model source cannot be replayed
    and keeps what the untimed generations taught its rates."""

    drafts_from_tokens = True
    learns_across_answers = True
