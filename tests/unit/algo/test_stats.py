import torch

from tracerl.algo.stats import explained_variance


def test_explained_variance() -> None:
    gen = torch.Generator().manual_seed(21)
    returns = torch.randn(100, generator=gen)
    mask = (torch.rand(100, generator=gen) < 0.8).long()
    assert explained_variance(returns, returns, mask) == 1.0  # a perfect critic
    mean = returns[mask.bool()].mean()
    assert abs(explained_variance(torch.full((100,), float(mean)), returns, mask)) < 1e-9
    values = returns + torch.randn(100, generator=gen) * 0.5
    r, v = returns[mask.bool()].double(), values[mask.bool()].double()
    expected = 1 - (r - v).var(unbiased=False) / r.var(unbiased=False)
    assert abs(explained_variance(values, returns, mask) - float(expected)) < 1e-9


def test_explained_variance_is_none_without_return_variance() -> None:
    assert explained_variance(torch.randn(10), torch.ones(10), torch.ones(10)) is None
    assert explained_variance(torch.randn(10), torch.randn(10), torch.zeros(10)) is None
