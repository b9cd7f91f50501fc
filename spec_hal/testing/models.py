"""Tiny deterministic float64 models (see the package docstring).

Sizes are small (V = 64, H = 16 by default) so that the models run in microseconds on CPU, but the
weights are scaled so that a logit gap between the best tokens is typically of order one: a
position off by one (RoPE rotates the token embedding by ``position * frequency`` with a lowest
frequency of one radian) or a wrong hidden state changes the drafted tokens, which the tests
prove (tests/test_tree_cases_catch_bugs.py::test_buggy_drivers_change_the_drafted_tokens).
"""
from __future__ import annotations

from typing import Optional

import torch

DTYPE = torch.float64
ROPE_BASE = 10.0  # small base: even the slowest rotated pair turns noticeably per position


def rope(x: torch.Tensor, positions: torch.Tensor, *, base: float = ROPE_BASE) -> torch.Tensor:
    """Rotate pairs (x[..., k], x[..., k + H/2]) by ``positions * base^(-k / (H/2))`` radians.

    x: (..., H) float with H even; positions: x.shape[:-1] integer. Returns a new tensor of
    x's dtype (the angles are computed in float64).
    """
    half = x.shape[-1] // 2
    frequencies = base ** (-torch.arange(half, dtype=DTYPE, device=x.device) / half)
    angle = positions.to(DTYPE)[..., None] * frequencies
    first, second = x[..., :half], x[..., half:]
    cos, sin = torch.cos(angle), torch.sin(angle)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1).to(x.dtype)


def _weights(generator: torch.Generator, rows: int, cols: int, scale: float) -> torch.Tensor:
    return torch.randn(rows, cols, generator=generator, dtype=DTYPE) * scale


class _DraftLayer:
    """h' = tanh(rope(embed(token), position) @ w_token + h @ w_hidden)."""

    def __init__(self, generator: torch.Generator, hidden_size: int):
        self.w_token = _weights(generator, hidden_size, hidden_size, 1.0 / hidden_size ** 0.5)
        self.w_hidden = _weights(generator, hidden_size, hidden_size, 1.5 / hidden_size ** 0.5)

    def __call__(self, token_features: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(token_features @ self.w_token.to(token_features.device) + hidden @ self.w_hidden.to(hidden.device))


class _DraftBase:
    def __init__(self, *, vocab_size: int, hidden_size: int, seed: int, dtype: torch.dtype = DTYPE):
        if hidden_size % 2:
            raise ValueError("hidden_size must be even (RoPE rotates pairs)")
        self.generator = torch.Generator().manual_seed(seed)
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.embedding = _weights(self.generator, vocab_size, hidden_size, 1.0)
        self.head = _weights(self.generator, hidden_size, vocab_size, 4.0 / hidden_size ** 0.5)
        self.dtype = dtype

    def _layer(self, step: int) -> _DraftLayer:
        raise NotImplementedError

    def to(self, device) -> "_DraftBase":
        """Move the weights to ``device`` in the model's dtype (in place; returns self) so that
        calls do no copies."""
        self.embedding, self.head = self.embedding.to(device, self.dtype), self.head.to(device, self.dtype)
        for layer in self._all_layers():
            layer.w_token, layer.w_hidden = layer.w_token.to(device, self.dtype), layer.w_hidden.to(device, self.dtype)
        return self

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden: Optional[torch.Tensor], step: int):
        """input_ids (R,) int, positions (R,) int, hidden (R, H) float or None, step int.

        Returns logits (R, V) and the new hidden state (R, H), in the model's dtype (float64 by
        default; call ``to(device)`` first for another dtype).
        """
        device = input_ids.device
        features = rope(self.embedding.to(device)[input_ids.long()], positions)
        previous = torch.zeros_like(features) if hidden is None else hidden.to(features.dtype)
        new_hidden = self._layer(step)(features, previous)
        return new_hidden @ self.head.to(device), new_hidden


class EagleDraftModel(_DraftBase):
    """One draft layer reused at every step; consumes the previous hidden state (EAGLE)."""

    def __init__(self, *, vocab_size: int = 64, hidden_size: int = 16, seed: int = 0, dtype: torch.dtype = DTYPE):
        super().__init__(vocab_size=vocab_size, hidden_size=hidden_size, seed=seed, dtype=dtype)
        self.layer = _DraftLayer(self.generator, hidden_size)

    def _layer(self, step: int) -> _DraftLayer:
        return self.layer

    def _all_layers(self) -> list[_DraftLayer]:
        return [self.layer]


class ChainedMtpDraftModel(_DraftBase):
    """One layer per draft step (multi-layer MTP); step s runs layer s on the hidden state that
    layer s-1 produced (chained MTP, P18)."""

    def __init__(self, *, num_layers: int, vocab_size: int = 64, hidden_size: int = 16, seed: int = 0):
        super().__init__(vocab_size=vocab_size, hidden_size=hidden_size, seed=seed)
        self.layers = [_DraftLayer(self.generator, hidden_size) for _ in range(num_layers)]

    def _layer(self, step: int) -> _DraftLayer:
        if not 0 <= step < len(self.layers):
            raise IndexError(f"draft step {step} has no layer (the model has {len(self.layers)})")
        return self.layers[step]

    def _all_layers(self) -> list[_DraftLayer]:
        return self.layers


class TargetModel:
    """One causal single-head attention layer with RoPE on queries and keys, then a linear head.

    Factored as ``embed`` / ``attention`` / ``head`` so that a paged KV cache (keys and values per
    position) and a recurrent layer can be added without changing the math.
    """

    def __init__(self, *, vocab_size: int = 64, hidden_size: int = 16, seed: int = 1):
        generator = torch.Generator().manual_seed(seed)
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.embedding = _weights(generator, vocab_size, hidden_size, 1.0)
        self.w_query, self.w_key, self.w_value = (_weights(generator, hidden_size, hidden_size, 1.0 / hidden_size ** 0.5) for _ in range(3))
        self.w_head = _weights(generator, hidden_size, vocab_size, 4.0 / hidden_size ** 0.5)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (..., L) int -> (..., L, H) float64."""
        return self.embedding.to(tokens.device)[tokens.long()]

    def keys_values(self, features: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated keys and values, (..., L, H) each: what a KV cache stores per position."""
        return rope(features @ self.w_key.to(features.device), positions), features @ self.w_value.to(features.device)

    def attention(self, features, positions, keys, values, allowed: torch.Tensor) -> torch.Tensor:
        """Queries at ``positions`` attend ``keys``/``values`` where ``allowed`` (..., Lq, Lk) is True."""
        queries = rope(features @ self.w_query.to(features.device), positions)
        scores = queries @ keys.transpose(-1, -2) / self.hidden_size ** 0.5
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        return features + weights @ values

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.w_head.to(hidden.device)

    def forward(self, tokens: torch.Tensor, positions: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (bs, L) int; positions (bs, L) int (default 0..L-1).

        Returns logits (bs, L, V) float64 (row t predicts token t+1) and hidden (bs, L, H).
        """
        length = tokens.shape[-1]
        if positions is None:
            positions = torch.arange(length, device=tokens.device).expand(tokens.shape)
        features = self.embed(tokens)
        keys, values = self.keys_values(features, positions)
        causal = torch.ones(length, length, dtype=torch.bool, device=tokens.device).tril()
        hidden = self.attention(features, positions, keys, values, causal)
        return self.head(hidden), hidden

    def greedy(self, prompt: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """Plain greedy decoding: (bs, L) prompt -> (bs, num_tokens) int64 (ties to the lower id)."""
        tokens = prompt.long()
        for _ in range(num_tokens):
            logits, _ = self.forward(tokens)
            tokens = torch.cat([tokens, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
        return tokens[:, prompt.shape[1]:]
