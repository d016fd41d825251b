import math

import torch

from tracerl.engine.sampling import RowSampling, sample, truncate


def textbook_truncate(logprobs: list[float], top_p: float, top_k: int) -> list[float]:
    """Keep the k most likely tokens, then the smallest prefix whose mass reaches top_p."""
    order = sorted(range(len(logprobs)), key=lambda i: -logprobs[i])
    keep: set[int] = set()
    mass = 0.0
    for rank, i in enumerate(order):
        if top_k > 0 and rank >= top_k:
            break
        if rank > 0 and mass >= top_p:
            break
        keep.add(i)
        mass += math.exp(logprobs[i])
    return [lp if i in keep else -math.inf for i, lp in enumerate(logprobs)]


def test_truncate_matches_textbook_on_random_rows() -> None:
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        logits = torch.randn(4, 13, generator=g) * 3
        logprobs = torch.log_softmax(logits, -1)
        top_p = torch.rand(4, generator=g).clamp_min(0.05)
        top_k = torch.randint(-1, 8, (4,), generator=g)
        got = truncate(logprobs, top_p, top_k)
        for row in range(4):
            want = textbook_truncate(logprobs[row].tolist(), float(top_p[row]), int(top_k[row]))
            torch.testing.assert_close(got[row], torch.tensor(want))


def test_reported_logprob_is_temperature_scaled_and_untruncated() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    rows = [RowSampling(temperature=0.5, top_p=0.5, top_k=1)]
    tokens, logprobs = sample(logits, rows, [torch.Generator().manual_seed(1)])
    # top_k=1 leaves only token 0; its logprob is log_softmax(logits / 0.5)[0], not 0.
    assert tokens == [0]
    expected = torch.log_softmax(logits[0] / 0.5, -1)[0].item()
    assert logprobs[0] == expected


def test_greedy_rows_take_the_argmax_with_unscaled_logprob() -> None:
    logits = torch.tensor([[0.1, 3.0, 0.2], [5.0, 0.0, 0.0]])
    rows = [RowSampling(0.0, 1.0, -1), RowSampling(1.0, 1.0, 1)]
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    tokens, logprobs = sample(logits, rows, gens)
    assert tokens == [1, 0]
    assert logprobs[0] == torch.log_softmax(logits[0], -1)[1].item()


def test_sampling_follows_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[None]
    gen = torch.Generator().manual_seed(123)
    counts = torch.zeros(4)
    draws = 4000
    for _ in range(draws):
        tokens, _ = sample(logits, [RowSampling(1.0, 1.0, -1)], [gen])
        counts[tokens[0]] += 1
    # Binomial standard deviation is at most sqrt(0.25 / 4000) ~ 0.008; allow 4 sigma.
    torch.testing.assert_close(counts / draws, probs, atol=0.032, rtol=0)


def test_same_generator_state_same_tokens() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    rows = [RowSampling(1.0, 0.9, 20)] * 3
    a = sample(logits, rows, [torch.Generator().manual_seed(s) for s in (1, 2, 3)])
    b = sample(logits, rows, [torch.Generator().manual_seed(s) for s in (1, 2, 3)])
    assert a == b
