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


def _weights(generator: torch.Generator, rows: int, cols: int, scale: float, dtype: torch.dtype = DTYPE) -> torch.Tensor:
    """Seeded N(0, scale^2) weights on the generator's device, drawn in ``dtype`` (float64 by
    default: the small models' values must not change; the realistic-size demo draws bfloat16 on
    the GPU directly, 1 GB per matrix)."""
    return torch.randn(rows, cols, generator=generator, dtype=dtype, device=generator.device) * scale


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
    """One causal single-head attention layer with RoPE on queries and keys, then a linear head;
    optionally a recurrent (Mamba-like) layer before the attention (``recurrent=True``).

    Per token t with embedding x_t:

    * recurrent layer (hybrid models only): a convolution window ``w`` of the last
      ``CONV_WIDTH`` embeddings and an SSM-like state ``r``:
      ``u = c0 x_t + c1 w[-1] + c2 w[-2]``, ``r_t = tanh(u W_in + r_{t-1} W_rec)``,
      ``w_t = (w[-1], x_t)``, and the layer output ``h_t = x_t + g r_t`` (g = ``context_gain``);
      otherwise ``h_t = x_t``;
    * attention over h (keys and values per position: what a KV cache stores; the values are
      scaled by ``context_gain``), residual;
    * ``logits = (h_t + attention) W_head``.

    The recurrent state after a token depends on every earlier token, so committing the state of
    the wrong tree node changes all later logits; the attention reads keys and values per position,
    so a KV slot holding the wrong position's KV changes them too. Weights are scaled so that the
    current token dominates the logits (a draft that only sees the current token agrees with the
    target most of the time, see :class:`NoisyDraftModel`), while the context still decides some
    argmaxes.
    """

    CONV_WIDTH = 2

    def __init__(self, *, vocab_size: int = 64, hidden_size: int = 16, seed: int = 1, recurrent: bool = False,
                 context_gain: float = 1.0, dtype: torch.dtype = DTYPE, device=None):
        # ``device``: draw the weights there (a realistic size drawn on the CPU takes tens of seconds)
        generator = torch.Generator(device=device or "cpu").manual_seed(seed)
        self.vocab_size, self.hidden_size, self.recurrent, self.dtype = vocab_size, hidden_size, recurrent, dtype
        scale = 1.0 / hidden_size ** 0.5
        self.embedding = _weights(generator, vocab_size, hidden_size, 1.0, dtype)
        self.w_query, self.w_key = (_weights(generator, hidden_size, hidden_size, 2 * scale, dtype) for _ in range(2))
        self.w_value = _weights(generator, hidden_size, hidden_size, context_gain * scale, dtype)
        self.w_head = _weights(generator, hidden_size, vocab_size, 4.0 * scale, dtype)
        self.conv = torch.tensor([1.0, 0.5, 0.25], dtype=dtype, device=generator.device)
        self.w_in = _weights(generator, hidden_size, hidden_size, scale, dtype)
        self.recurrent_gain = context_gain
        self.w_rec = _weights(generator, hidden_size, hidden_size, 1.5 * scale, dtype)

    def to(self, device) -> "TargetModel":
        """Move the weights to ``device`` (in place; returns self) so that calls do no copies."""
        for name in ("embedding", "w_query", "w_key", "w_value", "w_head", "conv", "w_in", "w_rec"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    # -- pieces (shared by the contiguous reference below and the paged engine) ----------------

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (..., L) int -> (..., L, H) float64."""
        return self.embedding[tokens.long()]

    def initial_recurrent_state(self, batch: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero SSM state (batch, H) and conv window (batch, CONV_WIDTH, H), in the model's dtype."""
        return (torch.zeros(batch, self.hidden_size, dtype=self.dtype, device=device),
                torch.zeros(batch, self.CONV_WIDTH, self.hidden_size, dtype=self.dtype, device=device))

    def recurrent_step(self, features, ssm, conv) -> tuple[torch.Tensor, torch.Tensor]:
        """One token: features (B, H), ssm (B, H), conv (B, W, H) -> new (ssm, conv)."""
        mixed = self.conv[0] * features + self.conv[1] * conv[:, -1] + self.conv[2] * conv[:, -2]
        new_ssm = torch.tanh(mixed @ self.w_in + ssm @ self.w_rec)
        return new_ssm, torch.cat([conv[:, 1:], features[:, None]], dim=1)

    def keys_values(self, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated keys and values, (..., L, H) each: what a KV cache stores per position."""
        return rope(hidden @ self.w_key, positions), hidden @ self.w_value

    def attention(self, hidden, positions, keys, values, allowed: torch.Tensor) -> torch.Tensor:
        """Queries at ``positions`` attend ``keys``/``values`` where ``allowed`` (..., Lq, Lk) is True."""
        queries = rope(hidden @ self.w_query, positions)
        scores = queries @ keys.transpose(-1, -2) / self.hidden_size ** 0.5
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        return hidden + weights @ values

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.w_head

    # -- contiguous reference (no cache, no speculation) ---------------------------------------

    def recurrent_scan(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens (bs, L) -> (SSM state after every token (bs, L, H), final ssm (bs, H), final conv)."""
        features = self.embed(tokens)
        ssm, conv = self.initial_recurrent_state(tokens.shape[0], tokens.device)
        states = []
        for t in range(tokens.shape[1]):
            ssm, conv = self.recurrent_step(features[:, t], ssm, conv)
            states.append(ssm)
        return torch.stack(states, dim=1), ssm, conv

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (bs, L) int at positions 0..L-1 -> logits (bs, L, V) in the model's dtype (row t predicts t+1)."""
        length = tokens.shape[-1]
        positions = torch.arange(length, device=tokens.device).expand(tokens.shape)
        hidden = self.embed(tokens)
        if self.recurrent:
            hidden = hidden + self.recurrent_gain * self.recurrent_scan(tokens)[0]
        keys, values = self.keys_values(hidden, positions)
        causal = torch.ones(length, length, dtype=torch.bool, device=tokens.device).tril()
        return self.head(self.attention(hidden, positions, keys, values, causal))

    def greedy(self, prompt: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """Plain greedy decoding: (bs, L) prompt -> (bs, num_tokens) int64 (ties to the lower id).

        Incremental, as a decoder with a KV cache runs: each new token computes its own keys,
        values and recurrent state once and attends the stored ones, so the cost grows linearly
        with the tokens generated (one :meth:`forward` over the whole sequence per token would be
        quadratic). Same arithmetic per row as :meth:`forward` (tests/test_demo.py compares them).
        """
        tokens = prompt.long()
        bs, length = tokens.shape
        device = tokens.device
        positions = torch.arange(length, device=device).expand(bs, length)
        hidden = self.embed(tokens)
        if self.recurrent:
            states, ssm, conv = self.recurrent_scan(tokens)
            hidden = hidden + self.recurrent_gain * states
        keys, values = self.keys_values(hidden, positions)
        capacity = length + num_tokens
        key_cache = torch.empty(bs, capacity, self.hidden_size, dtype=keys.dtype, device=device)
        value_cache = torch.empty_like(key_cache)
        key_cache[:, :length], value_cache[:, :length] = keys, values
        last = hidden[:, -1:]
        generated = torch.empty(bs, num_tokens, dtype=torch.int64, device=device)
        for step in range(num_tokens):
            filled = length + step
            position = torch.full((bs, 1), filled - 1, device=device)
            allowed = torch.ones(bs, 1, filled, dtype=torch.bool, device=device)
            logits = self.head(self.attention(last, position, key_cache[:, :filled], value_cache[:, :filled], allowed))
            generated[:, step] = logits[:, -1].argmax(dim=-1)
            if step + 1 == num_tokens:
                break
            new = self.embed(generated[:, step:step + 1])
            if self.recurrent:
                ssm, conv = self.recurrent_step(new[:, 0], ssm, conv)
                new = new + self.recurrent_gain * ssm[:, None]
            key_cache[:, filled:filled + 1], value_cache[:, filled:filled + 1] = self.keys_values(new, position + 1)
            last = new
        return generated

    def next_token_probs(self, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
        """The target's sampling distribution after ``tokens`` (bs, L): (bs, V) float64."""
        return torch.softmax(self.forward(tokens)[:, -1] / temperature, dim=-1)


class NoisyDraftModel:
    """A draft that sees only the current token: the target's head applied to the token's
    embedding, plus fixed per-token noise. It agrees with the target's argmax most of the time
    (the target's current-token term dominates) but not always (context and noise decide the
    rest). Follows the ``run_draft`` interface; the returned hidden state is the embedding.

    The noise is a (V, V) table of N(0, noise^2) entries, row = current token; with
    ``noise_rank=r`` it is the product of (V, r) and (r, V) factors with the same entry variance
    (a V = 128256 table would take 33 GB in bfloat16). Drawn in the target's dtype, on its device.
    """

    def __init__(self, target: TargetModel, *, noise: float = 0.5, seed: int = 2, noise_rank: Optional[int] = None):
        generator = torch.Generator(device=target.embedding.device).manual_seed(seed)
        self.target = target
        dtype, vocab = target.dtype, target.vocab_size
        if noise_rank is None:
            self.noise, self.noise_factor = _weights(generator, vocab, vocab, noise, dtype), None
        else:
            self.noise = _weights(generator, vocab, noise_rank, 1.0, dtype)
            self.noise_factor = _weights(generator, noise_rank, vocab, noise / noise_rank ** 0.5, dtype)

    def to(self, device) -> "NoisyDraftModel":
        self.target.to(device)
        self.noise = self.noise.to(device)
        if self.noise_factor is not None:
            self.noise_factor = self.noise_factor.to(device)
        return self

    def __call__(self, input_ids, positions, hidden, step):
        features = self.target.embed(input_ids)
        noise = self.noise[input_ids.long()]
        if self.noise_factor is not None:
            noise = noise @ self.noise_factor
        return self.target.head(features) + noise, features


class OracleDraftModel:
    """A draft that predicts a known continuation (a draft identical to the target when
    ``sequences`` is the target's greedy output), or never agrees with it (``agree=False``: it
    predicts the continuation's token + 1 mod V).

    ``sequences`` (bs, T) int64: prompt followed by the continuation, absolute position = column.
    Rows of a call belong to requests in order (rows // (rows / bs)); by the EAGLE shift a call at
    position p consumes the token at p + 1 and predicts the one at p + 2.
    """

    def __init__(self, sequences: torch.Tensor, *, vocab_size: int, agree: bool = True, hidden_size: int = 16):
        self.sequences, self.vocab_size, self.agree, self.hidden_size = sequences.long(), vocab_size, agree, hidden_size

    def to(self, device) -> "OracleDraftModel":
        self.sequences = self.sequences.to(device)
        return self

    def __call__(self, input_ids, positions, hidden, step):
        rows = input_ids.shape[0]
        batch, length = self.sequences.shape
        request = torch.arange(rows, device=input_ids.device) // max(rows // max(batch, 1), 1)
        column = (positions.long() + 2).clamp(0, length - 1)
        predicted = self.sequences[request, column]
        if not self.agree:
            predicted = (predicted + 1) % self.vocab_size
        # scatter, not one_hot: one_hot validates the ids on the host (a device sync on CUDA)
        logits = torch.zeros(rows, self.vocab_size, dtype=DTYPE, device=input_ids.device)
        logits.scatter_(1, predicted[:, None], 20.0)
        return logits, torch.zeros(rows, self.hidden_size, dtype=DTYPE, device=input_ids.device)
