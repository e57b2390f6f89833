"""Counter-based randomness: one element or a broadcast tensor, the same bits; good draws."""

from __future__ import annotations

import hashlib
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcore import counter_random as keyed

KEY = keyed.make_key("tests.keyed", 7)
# Any Python int is a coordinate (taken modulo 2**64): negative, beyond int64, beyond 2**64.
coordinates = st.integers(-(2**70), 2**70) | st.sampled_from([0, -1, 2**63 - 1, 2**63, 2**64 - 1])
words = st.integers(0, 2**64 - 1)


def _tensor(values: list[int]) -> torch.Tensor:
    return torch.tensor([keyed.signed64(v) for v in values], dtype=torch.int64)


def test_the_chain_starts_like_splitmix64() -> None:
    """absorb(0, 0) = mix64(GAMMA): splitmix64's first output from seed 0, a published value."""
    assert keyed.hash64(0, 0) == 0xE220A8397B1DCDAF
    assert keyed.mix64(0) == 0
    assert keyed.hash64(KEY) == KEY  # no coordinates: the key itself


def test_pinned_values() -> None:
    """The definition must not drift: runs (fault plans, synthetic streams) replay from it."""
    assert keyed.hash64(12345, 1, 2, 3) == 0x4DDF576A3C8EE8D0
    assert keyed.uniform_tensor(12345, 1, 2, 3).item() == 0.3041891703001586
    z0, z1 = keyed.gaussian_pair_tensor(12345, 1, 2, 3)
    assert (z0.item(), z1.item()) == (-1.3350688914336015, -0.7731766007129067)
    assert keyed.logistic_tensor(12345, 1, 2, 3).item() == -0.8274280483825223


def test_string_id_is_blake2b() -> None:
    digest = hashlib.blake2b(b"n0", digest_size=8).digest()
    assert keyed.string_id("n0") == int.from_bytes(digest, "little")
    assert keyed.string_id("n0") != keyed.string_id("n1")
    ids = keyed.string_ids(["n0", "n1"])
    assert ids.dtype == torch.int64 and ids.tolist() == [
        keyed.signed64(keyed.string_id(n)) for n in ("n0", "n1")
    ]
    assert keyed.make_key("a", 1) != keyed.make_key("b", 1)


@given(key=words, a=st.lists(coordinates, min_size=1, max_size=6), b=coordinates)
@settings(max_examples=200)
def test_broadcast_hashes_are_one_element_hashes(key: int, a: list[int], b: int) -> None:
    expected = [keyed.signed64(keyed.hash64(key, b, c, b)) for c in a]
    assert keyed.hash64_tensor(key, b, _tensor(a), b).tolist() == expected
    # A tensor key continues the chain: hash64(key, x, y) = absorb(hash64(key, x), y).
    head = keyed.hash64_tensor(key, _tensor(a))
    assert keyed.hash64_tensor(head, b).tolist() == [
        keyed.signed64(keyed.absorb(keyed.hash64(key, c), b)) for c in a
    ]
    assert keyed.mix64_tensor(_tensor(a)).tolist() == [keyed.signed64(keyed.mix64(c)) for c in a]
    assert int(keyed.hash64_tensor(key, b, b)) == keyed.signed64(keyed.hash64(key, b, b))


@given(key=words, a=st.lists(coordinates, min_size=1, max_size=5))
@settings(max_examples=100)
def test_broadcast_draws_are_one_element_draws(key: int, a: list[int]) -> None:
    """Uniform, Gaussian pairs and logistic draws: the same floats, bit for bit, whether
    drawn for a grid or for one element with int coordinates."""
    rows = _tensor(a)[:, None]
    cols = torch.arange(3)
    u = keyed.uniform_tensor(key, rows, cols)
    z0, z1 = keyed.gaussian_pair_tensor(key, rows, cols)
    g = keyed.gaussian_tensor(key, rows, cols)
    logit = keyed.logistic_tensor(key, rows, cols)
    assert u.shape == z0.shape == logit.shape == (len(a), 3)
    for i, c in enumerate(a):
        for j in range(3):
            pair = keyed.gaussian_pair_tensor(key, c, j)
            assert u[i, j].item() == keyed.uniform_tensor(key, c, j).item()
            assert (z0[i, j].item(), z1[i, j].item()) == (pair[0].item(), pair[1].item())
            assert g[i, j].item() == keyed.gaussian_tensor(key, c, j).item()
            assert logit[i, j].item() == keyed.logistic_tensor(key, c, j).item()
    assert bool(((u >= 0) & (u < 1)).all())


finite = st.floats(min_value=5e-324, max_value=1e300, allow_nan=False, allow_infinity=False)


@given(xs=st.lists(finite, min_size=1, max_size=20))
@settings(max_examples=100)
def test_portable_log_and_sqrt(xs: list[float]) -> None:
    """A tensor and its elements alone agree (subnormals included) and stay within a few
    ulps of libm."""
    t = torch.tensor(xs, dtype=torch.float64)
    logs, roots = keyed.log_tensor(t).tolist(), keyed.sqrt_tensor(t).tolist()
    assert logs == [keyed.log_tensor(torch.tensor(x, dtype=torch.float64)).item() for x in xs]
    assert roots == [keyed.sqrt_tensor(torch.tensor(x, dtype=torch.float64)).item() for x in xs]
    for x, log, root in zip(xs, logs, roots, strict=True):
        assert log == pytest.approx(math.log(x), rel=4e-16, abs=4e-16)
        assert root == pytest.approx(math.sqrt(x), rel=4e-16)


@given(xs=st.lists(st.floats(-8e8, 8e8, allow_nan=False), min_size=1, max_size=20))
@settings(max_examples=100)
def test_portable_sin_cos(xs: list[float]) -> None:
    s, c = keyed.sin_cos_tensor(torch.tensor(xs, dtype=torch.float64))
    pairs = list(zip(s.tolist(), c.tolist(), strict=True))
    for x, pair in zip(xs, pairs, strict=True):
        one = keyed.sin_cos_tensor(torch.tensor(x, dtype=torch.float64))
        assert pair == (one[0].item(), one[1].item())
        assert pair == pytest.approx((math.sin(x), math.cos(x)), abs=1e-15)


def test_domain_edges() -> None:
    assert keyed.log_tensor(torch.tensor([0.0, -1.0, 1.0])).tolist()[::2] == [-math.inf, 0.0]
    assert math.isnan(keyed.log_tensor(torch.tensor([-1.0])).item())
    assert keyed.sqrt_tensor(torch.tensor([0.0, 4.0])).tolist() == [0.0, 2.0]
    assert math.isnan(keyed.sqrt_tensor(torch.tensor([-4.0])).item())
    with pytest.raises(TypeError):
        keyed.absorb_tensor(1, 2)


def test_uniform_is_uniform_and_coordinates_are_independent() -> None:
    """200,000 draws over consecutive coordinates: flat histogram, balanced bits, no
    correlation between neighbours (a weak hash fails these with consecutive counters)."""
    n = 200_000
    u = keyed.uniform_tensor(KEY, 3, torch.arange(n))
    counts = torch.bincount((u * 100).long(), minlength=100).double()
    chi2 = float(((counts - n / 100) ** 2 / (n / 100)).sum())
    assert chi2 < 99 + 5 * math.sqrt(2 * 99)  # 99 degrees of freedom, 5 sigma
    words = keyed.hash64_tensor(KEY, 3, torch.arange(n))
    ones = torch.stack([((words >> b) & 1) for b in range(64)]).double().mean(dim=1)
    assert float((ones - 0.5).abs().max()) < 5 * 0.5 / math.sqrt(n)
    centred = u - 0.5
    assert abs(float((centred[1:] * centred[:-1]).mean())) < 5 / 12 / math.sqrt(n)
    other = keyed.uniform_tensor(KEY, 4, torch.arange(n))  # the next value of a coordinate
    assert abs(float((centred * (other - 0.5)).mean())) < 5 / 12 / math.sqrt(n)


def test_gaussian_and_logistic_distributions() -> None:
    n = 200_000
    z0, z1 = keyed.gaussian_pair_tensor(KEY, 5, torch.arange(n))
    for z in (z0, z1):
        assert abs(float(z.mean())) < 5 / math.sqrt(n)
        assert abs(float(z.var()) - 1) < 5 * math.sqrt(2 / n)
        assert abs(float((z**4).mean()) - 3) < 5 * math.sqrt(96 / n)
        assert abs(float((z.abs() < 1).double().mean()) - 0.682689) < 0.005
    assert abs(float((z0 * z1).mean())) < 5 / math.sqrt(n)
    logit = keyed.logistic_tensor(KEY, 6, torch.arange(n))
    for margin in (-2.0, 0.0, 0.5, 3.0):
        rate = float((logit < margin).double().mean())
        assert abs(rate - 1 / (1 + math.exp(-margin))) < 0.005


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_agrees_with_cpu() -> None:
    coords = torch.randint(-(2**62), 2**62, (10_000,), generator=torch.Generator().manual_seed(0))
    cpu = (
        keyed.hash64_tensor(KEY, 1, coords),
        *keyed.gaussian_pair_tensor(KEY, 2, coords),
        keyed.logistic_tensor(KEY, 3, coords),
        *keyed.sin_cos_tensor(coords.double() * 1e-10),
        keyed.log_tensor(coords.double().abs()),
        keyed.sqrt_tensor(coords.double().abs()),
    )
    on = coords.cuda()
    cuda = (
        keyed.hash64_tensor(KEY, 1, on),
        *keyed.gaussian_pair_tensor(KEY, 2, on),
        keyed.logistic_tensor(KEY, 3, on),
        *keyed.sin_cos_tensor(on.double() * 1e-10),
        keyed.log_tensor(on.double().abs()),
        keyed.sqrt_tensor(on.double().abs()),
    )
    for a, b in zip(cpu, cuda, strict=True):
        assert b.device.type == "cuda" and torch.equal(a, b.cpu())
