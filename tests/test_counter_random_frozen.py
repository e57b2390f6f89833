"""The keyed hash and its draws, frozen as digests (one element at a time, and broadcast).

Fault plans, online streams and codecs draw from :mod:`fedcore.counter_random`; runs replay only
while every word and every float it returns stays the same. The functions use only
operations IEEE 754 rounds exactly, so these digests hold on every machine. They were
taken from the scalar Python twin the module had before its tensor form became the only
one: an independent reference.
"""

from __future__ import annotations

import hashlib
import struct

import torch

from fedcore import counter_random as keyed
from fedcore.streams import SyntheticDrift

KEY = keyed.make_key("tests.keyed.frozen", 3, 1)
COORDS = [0, 1, 2, 7, -1, -5, 2**31, 2**40 + 3, 2**63 - 1, 2**63, 2**64 - 1, 2**70 + 9]
FLOATS = [5e-324, 1e-300, 2.2e-308, 1e-5, 0.1, 0.5, 0.7071067811865476, 1.0, 1.5, 2.0, 3.0]
FLOATS += [10.0, 12345.678, 1e20, 1e300, -0.0, -1.0, -3.5, 8e8, 1e9 + 0.5]


def _digest(values: list[float]) -> str:
    return hashlib.sha256(b"".join(struct.pack("<d", v) for v in values)).hexdigest()


def _words(values: list[int]) -> str:
    return hashlib.sha256(
        b"".join(struct.pack("<q", keyed.signed64(v)) for v in values)
    ).hexdigest()


def _one(t: torch.Tensor | tuple[torch.Tensor, ...]) -> list[float]:
    return [v.item() for v in t] if isinstance(t, tuple) else [t.item()]


def scalar_digests() -> dict[str, str]:
    """The digests of every draw, one value at a time from Python ints and floats."""
    pairs = [(a, b) for a in COORDS for b in COORDS[:6]]
    positive = [abs(x) for x in FLOATS if x != 0]
    return {
        "hash64": _words([keyed.hash64(KEY, a, b) for a, b in pairs]),
        "absorb": _words([keyed.absorb(a, b) for a, b in pairs]),
        "mix64": _words([keyed.mix64(a) for a in COORDS]),
        "uniform": _digest([v for a, b in pairs for v in _one(keyed.uniform_tensor(KEY, a, b))]),
        "gaussian": _digest(
            [v for a, b in pairs for v in _one(keyed.gaussian_pair_tensor(KEY, a, b))]
        ),
        "logistic": _digest([v for a, b in pairs for v in _one(keyed.logistic_tensor(KEY, a, b))]),
        "log": _digest([v for x in positive for v in _one(keyed.log_tensor(_float(x)))]),
        "sqrt": _digest([v for x in positive for v in _one(keyed.sqrt_tensor(_float(x)))]),
        "sin_cos": _digest([v for x in FLOATS for v in _one(keyed.sin_cos_tensor(_float(x)))]),
    }


def _float(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def tensor_digests() -> dict[str, str]:
    """The same digests, from the tensor form over the whole grid at once."""
    a = torch.tensor([keyed.signed64(c) for c in COORDS], dtype=torch.int64)[:, None]
    b = torch.tensor([keyed.signed64(c) for c in COORDS[:6]], dtype=torch.int64)[None, :]
    x = torch.tensor(FLOATS, dtype=torch.float64)
    positive = x.abs()[x != 0]
    z0, z1 = keyed.gaussian_pair_tensor(KEY, a, b)
    s, c = keyed.sin_cos_tensor(x)
    return {
        "hash64": _words(keyed.hash64_tensor(KEY, a, b).reshape(-1).tolist()),
        "absorb": _words(keyed.absorb_tensor(a, b).reshape(-1).tolist()),
        "mix64": _words(keyed.mix64_tensor(a).reshape(-1).tolist()),
        "uniform": _digest(keyed.uniform_tensor(KEY, a, b).reshape(-1).tolist()),
        "gaussian": _digest(torch.stack([z0, z1], dim=-1).reshape(-1).tolist()),
        "logistic": _digest(keyed.logistic_tensor(KEY, a, b).reshape(-1).tolist()),
        "log": _digest(keyed.log_tensor(positive).tolist()),
        "sqrt": _digest(keyed.sqrt_tensor(positive).tolist()),
        "sin_cos": _digest(torch.stack([s, c], dim=-1).reshape(-1).tolist()),
    }


def stream_digest() -> str:
    """One node's synthetic batches, small (the per-node path) and all nodes at once."""
    digest = hashlib.sha256()
    source = SyntheticDrift(nodes=3, features=5, batch_size=4, rounds=10, seed=9)
    big = SyntheticDrift(nodes=200_000, features=3, batch_size=2, rounds=10, seed=9)
    for s in (source, big):
        for node, round in ((0, 0), (2, 7), (1, 3)):
            x, y = s.batch(node, round)
            digest.update(x.numpy().tobytes() + y.numpy().tobytes())
    return digest.hexdigest()


FROZEN: dict[str, str] = {
    "hash64": "ed124a6b5a962e9f90031c4ce10d47e69bb4be45eaa8295b7363c274c7a07a7d",
    "absorb": "fd6fecb4b2c00a0ced5ee3e660db1741f262251cbba5b15c86c5ed40278a85b9",
    "mix64": "52b46a96f974864dba7a482793edd711f137dec0548aa50ad87997cb2daa0ed7",
    "uniform": "d4f8037fe6ff6ff47391f2c5b46aa35e8b3a0d603e244d090f9b71694751630c",
    "gaussian": "6218082f7a0ce18ae1acd7fddff1f134202341b12d76406c2c50053b92f623a8",
    "logistic": "3ea228fd2a2250a6e26779d58c7527e53c3e33946f7acf20a483953dec0c841f",
    "log": "a6d65b31e289bc567e72fca0a252ecc8530b494e0dc049cb95d1fd5fb6cf820b",
    "sqrt": "3ed77abc2c66dec35abe941264c7ad76c61ad9eaf211a5137ef836600636b70b",
    "sin_cos": "db7afc7a3a1da7c78a9daaf42ce94c8c8cced69ee817dc408492fe706bc6ae4a",
}

FROZEN_STREAM = "1fd32d51ad0255b809bc7e3bd3c77a7837db375182e3ac5e0c50fc7f71c78b9c"


def test_scalar_draws_are_frozen() -> None:
    assert scalar_digests() == FROZEN


def test_tensor_draws_are_frozen() -> None:
    assert tensor_digests() == FROZEN


def test_stream_batches_are_frozen() -> None:
    assert stream_digest() == FROZEN_STREAM


if __name__ == "__main__":
    print(scalar_digests())
    print(tensor_digests() == scalar_digests())
    print(stream_digest())
