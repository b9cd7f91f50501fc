"""A small regular language for grammar-constrained decoding tests (docs/structured-output.md).

:class:`ModularSumGrammar`: the running sum of the generated tokens modulo ``m`` is never 0 after
a token (a DFA with m states: state = running sum mod m; token t is allowed in state s iff
(s + t) mod m != 0). Its states depend on the whole history, so an engine must walk each tree
node's root-to-node path (``spec_hal.tree_paths``) to build the node's mask row, exactly as a
real grammar matcher (xgrammar) would.
"""
from __future__ import annotations

import torch

from ..masks import pack_bitmask


class ModularSumGrammar:
    def __init__(self, *, vocab_size: int, modulus: int = 4):
        self.vocab_size, self.modulus = vocab_size, modulus

    def initial_state(self, batch: int, device) -> torch.Tensor:
        """(bs,) int64: the state before the first generated token."""
        return torch.zeros(batch, dtype=torch.int64, device=device)

    def advance(self, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return (states + tokens.to(torch.int64)) % self.modulus

    def allowed(self, states: torch.Tensor) -> torch.Tensor:
        """(*states.shape, V) bool."""
        tokens = torch.arange(self.vocab_size, device=states.device)
        return (states[..., None] + tokens) % self.modulus != 0

    def bitmask(self, states: torch.Tensor) -> torch.Tensor:
        """(rows, ceil(V/32)) int32 xgrammar-layout mask of flat ``states`` (rows,)."""
        return pack_bitmask(self.allowed(states.reshape(-1)))

    def accepts(self, tokens: torch.Tensor) -> bool:
        """Whether every row of generated ``tokens`` (bs, L) is in the language."""
        states = self.initial_state(tokens.shape[0], tokens.device)
        for column in tokens.t():
            if not bool(self.allowed(states).gather(1, column[:, None].long()).all()):
                return False
            states = self.advance(states, column)
        return True

    def greedy(self, target, prompt: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """Constrained greedy decoding of ``target``: argmax over allowed tokens (ties to the lower
        id). (bs, L) prompt -> (bs, num_tokens) int64."""
        tokens = prompt.long()
        states = self.initial_state(prompt.shape[0], prompt.device)
        for _ in range(num_tokens):
            logits = target.forward(tokens)[:, -1]
            logits = torch.where(self.allowed(states), logits, torch.full_like(logits, float("-inf")))
            chosen = logits.argmax(dim=-1)
            states = self.advance(states, chosen)
            tokens = torch.cat([tokens, chosen[:, None]], dim=1)
        return tokens[:, prompt.shape[1]:]


def node_states(grammar, tree, states: torch.Tensor) -> torch.Tensor:
    """(bs, N) grammar state after each node's root-to-node path (the root excluded: ``states``
    (bs,) is the state after the root). Unreachable / padded nodes keep ``states``."""
    from ..tree import tree_paths

    paths = tree_paths(tree)
    bs, nodes, width = paths.shape
    tokens = tree.tokens.view(bs, nodes)
    current = states[:, None].expand(bs, nodes).clone()
    for depth in range(1, width):
        node = paths[:, :, depth]
        token = tokens.gather(1, node.clamp(min=0))
        current = torch.where(node >= 0, grammar.advance(current, token), current)
    return current
