"""End-to-end conformance: the speculative-decoding loop of ``spec_hal.testing.engine`` with every
op run by the backend under test (issue 7).

Unit cases compare an op with its reference; these compare the whole loop with what speculative
decoding must produce regardless of any reference: greedy speculation is lossless (token for
token the target's plain greedy decoding), acceptance hits its floors (a draft identical to the
target accepts everything, one that never agrees accepts nothing), sampling draws from the
target's distribution, and the live recurrent state after a round is the state of decoding the
committed tokens one by one. The checks take the ops as a parameter so that tests/ can prove that
a wrong KV move, a wrong Mamba commit or a wrong bonus stride fails them.

Greedy design. The full product (5 (S, K, N) x page size {1, 16} x recurrent {off, on} x graphs
{off, on} x bs {1, 4} = 80 runs) is too slow under the Triton interpreter, so the cases run a
strength-2 covering design of 10 runs: each (S, K, N) appears twice, with complementary settings
of the four two-level factors, and the five base rows are chosen so that every pair of values of
every two factors occurs (``test_e2e_design_covers_all_pairs`` proves it).
"""
from __future__ import annotations

import contextlib
import itertools
import math

import pytest
import torch

from spec_hal.conformance.guards import no_host_sync
from spec_hal.testing.engine import EngineConfig, SpeculativeEngine
from spec_hal.testing.models import NoisyDraftModel, OracleDraftModel, TargetModel

pytestmark = pytest.mark.spec_hal_op("e2e")

VOCAB, HIDDEN, PROMPT_LEN, MAX_TOKENS = 32, 16, 5, 8
CONTEXT_GAIN, DRAFT_NOISE = 0.5, 0.3
SHAPES = ((1, 1, 2), (3, 1, 4), (5, 4, 8), (3, 4, 16), (5, 8, 32))
# Two-level factors: (page size, recurrent layer, graphs, batch size).
LEVELS = ((1, 16), (False, True), (False, True), (1, 4))
BASE_ROWS = ((0, 0, 0, 0), (0, 0, 1, 1), (0, 1, 0, 1), (0, 1, 1, 0), (1, 0, 0, 1))


def greedy_design() -> list[tuple]:
    """10 runs (S, K, N, page_size, recurrent, graphs, bs): each shape with a base row and its complement."""
    runs = []
    for shape, base in zip(SHAPES, BASE_ROWS):
        for row in (base, tuple(1 - level for level in base)):
            runs.append((*shape, *(levels[index] for levels, index in zip(LEVELS, row))))
    return runs


GREEDY_DESIGN = greedy_design()
SAMPLING_VOCAB, SAMPLING_TEMPERATURE = 8, 1.0
SAMPLING_RUNS = {"triton-interpret": 384}  # the interpreter runs draft_topk at ~30 ms per row
DEFAULT_SAMPLING_RUNS = 4096
P_VALUE_FLOOR = 1e-3  # chi-square test; a correct backend fails it with probability 0.1 %


@pytest.fixture(autouse=True, scope="module")
def _one_cpu_thread():
    """The models are tiny: OpenMP threads cost far more than the work on a loaded CI machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def prompts(batch_size: int, *, seed: int, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, vocab, (batch_size, PROMPT_LEN), generator=torch.Generator().manual_seed(seed))


def run_engine(backend, target, draft, config: EngineConfig, prompt, *, ops=None, generator=None, hook=None):
    """Run the loop with every op on ``ops`` (default: the backend under test) under the no-sync guard."""
    engine = SpeculativeEngine(target, draft, ops=ops if ops is not None else backend, config=config,
                               guard=no_host_sync)
    return engine.generate(prompt, generator=generator, first_round_hook=hook)


def check_greedy_lossless(backend, *, steps, topk, draft_tokens, page_size, recurrent, graphs, bs, ops=None) -> None:
    """Speculative output equals plain greedy decoding of the target, token for token."""
    seed = steps * 100 + topk * 10 + bs
    target = TargetModel(vocab_size=VOCAB, hidden_size=HIDDEN, recurrent=recurrent, context_gain=CONTEXT_GAIN, seed=seed)
    draft = NoisyDraftModel(target, noise=DRAFT_NOISE, seed=seed + 1)
    prompt = prompts(bs, seed=seed)
    config = EngineConfig(steps=steps, topk=topk, draft_tokens=draft_tokens, page_size=page_size, graphs=graphs,
                          max_tokens=MAX_TOKENS)
    result = run_engine(backend, target, draft, config, prompt, ops=ops)
    expected = target.to("cpu").greedy(prompt, MAX_TOKENS)
    for row in range(bs):
        got, want = result.tokens[row].tolist(), expected[row].tolist()
        assert got == want, (f"request {row}: speculative output {got} != greedy target output {want} "
                             f"(S={steps} K={topk} N={draft_tokens} page={page_size} recurrent={recurrent} graphs={graphs})")


def check_acceptance_floor(backend, *, steps, topk, draft_tokens, agree: bool, ops=None) -> None:
    """A draft identical to the target (it predicts the target's greedy continuation) accepts every
    draft: acceptance length S + 1 in every round; one that never agrees accepts none: length 1."""
    bs, seed = 2, 31 + steps
    target = TargetModel(vocab_size=VOCAB, hidden_size=HIDDEN, recurrent=True, context_gain=CONTEXT_GAIN, seed=seed)
    prompt = prompts(bs, seed=seed)
    continuation = target.greedy(prompt, MAX_TOKENS + steps + 3)
    draft = OracleDraftModel(torch.cat([prompt, continuation], dim=1), vocab_size=VOCAB, agree=agree, hidden_size=HIDDEN)
    config = EngineConfig(steps=steps, topk=topk, draft_tokens=draft_tokens, page_size=16, max_tokens=MAX_TOKENS)
    result = run_engine(backend, target, draft, config, prompt, ops=ops)
    assert torch.equal(result.tokens, continuation[:, :MAX_TOKENS].cpu()), "the output is not the target's greedy output"
    floor = steps + 1 if agree else 1
    lengths = result.accept_lens[result.active]
    assert torch.all(lengths == floor), f"acceptance lengths {lengths.tolist()}, expected all {floor}"
    assert result.mean_acceptance_length == floor


def target_first_two_tokens(target: TargetModel, prompt: torch.Tensor, temperature: float) -> torch.Tensor:
    """(V, V) float64 joint distribution of the first two sampled tokens after ``prompt`` (1, L)."""
    vocab = target.vocab_size
    first = target.next_token_probs(prompt, temperature)[0]
    extended = torch.cat([prompt.expand(vocab, -1), torch.arange(vocab)[:, None]], dim=1)
    second = target.next_token_probs(extended, temperature)
    return first[:, None] * second


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor, *, min_expected: float = 5.0) -> tuple[float, float, int]:
    """Pearson chi-square goodness of fit; cells with expected count < min_expected are pooled.

    Returns (statistic, p-value, degrees of freedom). p = Q(dof / 2, statistic / 2).
    """
    counts, expected = counts.flatten().double(), probs.flatten().double() * counts.sum()
    small = expected < min_expected
    observed = torch.cat([counts[~small], counts[small].sum()[None]])
    expected = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = expected > 0
    observed, expected = observed[keep], expected[keep]
    statistic = float(((observed - expected) ** 2 / expected).sum())
    dof = observed.numel() - 1
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(statistic / 2, dtype=torch.float64)))
    return statistic, p_value, dof


def check_sampling_distribution(backend, *, steps=1, topk=3, draft_tokens=4, runs=None, ops=None) -> None:
    """At temperature > 0 the first two generated tokens follow the target's joint distribution."""
    runs = runs or SAMPLING_RUNS.get(backend.name, DEFAULT_SAMPLING_RUNS)
    target = TargetModel(vocab_size=SAMPLING_VOCAB, hidden_size=HIDDEN, recurrent=True, context_gain=CONTEXT_GAIN, seed=5)
    draft = NoisyDraftModel(target, noise=DRAFT_NOISE, seed=6)
    prompt = prompts(1, seed=5, vocab=SAMPLING_VOCAB)
    config = EngineConfig(steps=steps, topk=topk, draft_tokens=draft_tokens, page_size=16,
                          temperature=SAMPLING_TEMPERATURE, max_tokens=2)
    result = run_engine(backend, target, draft, config, prompt.expand(runs, -1), ops=ops,
                        generator=torch.Generator().manual_seed(2024))
    joint = target_first_two_tokens(target.to("cpu"), prompt, SAMPLING_TEMPERATURE)
    pairs = result.tokens[:, 0] * SAMPLING_VOCAB + result.tokens[:, 1]
    counts = torch.bincount(pairs, minlength=SAMPLING_VOCAB ** 2)
    statistic, p_value, dof = chi_square_p_value(counts, joint)
    assert p_value >= P_VALUE_FLOOR, (f"first two tokens over {runs} seeded runs do not follow the target: "
                                      f"chi2 = {statistic:.1f} with {dof} dof, p = {p_value:.2e} < {P_VALUE_FLOOR}")


def check_mamba_live_state(backend, *, steps=5, topk=4, draft_tokens=8, ops=None) -> None:
    """After a round accepting k of N drafts, the live recurrent state equals the state after
    decoding the committed tokens (prompt, root, k accepted drafts) one by one."""
    bs, seed = 4, 77
    target = TargetModel(vocab_size=VOCAB, hidden_size=HIDDEN, recurrent=True, context_gain=CONTEXT_GAIN, seed=seed)
    draft = NoisyDraftModel(target, noise=DRAFT_NOISE, seed=seed + 1)
    prompt = prompts(bs, seed=seed)
    config = EngineConfig(steps=steps, topk=topk, draft_tokens=draft_tokens, page_size=16, max_tokens=1)
    seen = {}

    def inspect(engine, emitted, verdict):
        ssm, conv = engine.live_recurrent_state()
        seen.update(ssm=ssm.cpu(), conv=conv.cpu(), emitted=emitted.cpu(), accept_lens=verdict.accept_lens.cpu(),
                    last=(verdict.accept_index.cpu().long().gather(1, verdict.accept_lens.cpu().long()[:, None] - 1)[:, 0]
                          - torch.arange(bs) * draft_tokens))

    run_engine(backend, target, draft, config, prompt, ops=ops, hook=inspect)
    target.to("cpu")
    accepted = seen["accept_lens"] - 1
    assert accepted.max() >= 1, "no draft was accepted: the case would not test a commit"
    assert torch.any(seen["last"] != accepted), "every last accepted node was node k: the case would not tell tree from chain"
    for row in range(bs):
        committed = torch.cat([prompt[row], seen["emitted"][row, :int(accepted[row])].long()])
        _, ssm, conv = target.recurrent_scan(committed[None])
        torch.testing.assert_close(seen["ssm"][row], ssm[0], rtol=1e-12, atol=1e-12,
                                   msg=lambda text: f"request {row} (k = {int(accepted[row])}): live SSM state is not the sequential one: {text}")
        torch.testing.assert_close(seen["conv"][row], conv[0], rtol=0, atol=0,
                                   msg=lambda text: f"request {row}: live conv window is not the last tokens': {text}")


@pytest.mark.parametrize("steps, topk, draft_tokens, page_size, recurrent, graphs, bs", GREEDY_DESIGN)
def test_e2e_greedy_lossless(backend, steps, topk, draft_tokens, page_size, recurrent, graphs, bs):
    check_greedy_lossless(backend, steps=steps, topk=topk, draft_tokens=draft_tokens, page_size=page_size,
                          recurrent=recurrent, graphs=graphs, bs=bs)


def test_e2e_design_covers_all_pairs():
    """Every value of every factor, and every pair of values of every two factors, is run."""
    columns = list(zip(*[((s, k, n), *rest) for s, k, n, *rest in GREEDY_DESIGN]))
    for first, second in itertools.combinations(range(len(columns)), 2):
        wanted = set(itertools.product(set(columns[first]), set(columns[second])))
        assert set(zip(columns[first], columns[second])) == wanted, f"factors {first} and {second}: pairs missing"


@pytest.mark.parametrize("steps, topk, draft_tokens", [(3, 1, 4), (5, 1, 6), (5, 4, 8)])
def test_e2e_identical_draft_accepts_everything(backend, steps, topk, draft_tokens):
    check_acceptance_floor(backend, steps=steps, topk=topk, draft_tokens=draft_tokens, agree=True)


@pytest.mark.parametrize("steps, draft_tokens", [(3, 4), (5, 6)])
def test_e2e_disagreeing_draft_accepts_nothing(backend, steps, draft_tokens):
    check_acceptance_floor(backend, steps=steps, topk=1, draft_tokens=draft_tokens, agree=False)


def test_e2e_sampling_matches_target_distribution(backend):
    check_sampling_distribution(backend)


def test_e2e_mamba_live_state_is_sequential_state(backend):
    check_mamba_live_state(backend)


def check_grammar_constrained_greedy(backend, *, steps, topk, draft_tokens, bs=2, ops=None) -> None:
    """Structured output: with a grammar (a regular language over the vocabulary whose state
    depends on the whole history, so every tree node's mask row comes from its root-to-node path),
    speculative output equals constrained greedy decoding of the target token for token, stays in
    the language, and differs from unconstrained decoding (so the grammar really constrained it)."""
    from spec_hal.testing.grammar import ModularSumGrammar

    seed = 7 * steps + topk
    target = TargetModel(vocab_size=VOCAB, hidden_size=HIDDEN, context_gain=CONTEXT_GAIN, seed=seed)
    draft = NoisyDraftModel(target, noise=DRAFT_NOISE, seed=seed + 1)
    grammar = ModularSumGrammar(vocab_size=VOCAB, modulus=3)
    prompt = prompts(bs, seed=seed)
    config = EngineConfig(steps=steps, topk=topk, draft_tokens=draft_tokens, max_tokens=MAX_TOKENS, grammar=grammar)
    result = run_engine(backend, target, draft, config, prompt, ops=ops)
    target.to("cpu")
    expected = grammar.greedy(target, prompt, MAX_TOKENS)
    assert result.tokens.tolist() == expected.tolist(), f"speculative {result.tokens.tolist()} != constrained greedy {expected.tolist()}"
    assert grammar.accepts(result.tokens)
    assert not grammar.accepts(target.greedy(prompt, MAX_TOKENS)), "the grammar did not constrain this prompt: pick another seed"


@pytest.mark.parametrize("steps, topk, draft_tokens", ((3, 1, 4), (3, 4, 8)))
def test_e2e_grammar_constrained_greedy(backend, steps, topk, draft_tokens):
    check_grammar_constrained_greedy(backend, steps=steps, topk=topk, draft_tokens=draft_tokens)
