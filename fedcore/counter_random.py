"""Counter-based randomness: keyed 64-bit hashes of integer coordinates, over tensors.

A simulation draws one random number per message or per example feature, and the
in-process engines ask for them at two scales: the message engine one message at a time,
the vectorized engine for every peer at once with ``[N, ...]`` tensors on CPU or CUDA.
A shared random state (``torch.Generator``, ``random``) would make the numbers depend on
the order of the draws, and one generator per call is slow. Here a number is a pure
function of a key and a few integer coordinates instead::

    hash64(key, c1, ..., ck) = absorb(...absorb(absorb(key, c1), c2)..., ck)
    absorb(h, c)            = mix64(h + c * STEP + GAMMA)       (mod 2**64)

``mix64`` is the splitmix64 finalizer (a bijection of 64-bit words with full avalanche);
``STEP`` and ``GAMMA`` are odd constants, so consecutive coordinates enter like the
counter of a splitmix64 stream. Every function is written once, over tensors: its
coordinates broadcast like any torch operation and it runs on their device, one element
or millions. The arithmetic emulates unsigned 64-bit words with int64 (addition and
multiplication wrap; a right shift is arithmetic, so each one is masked to a logical
shift); a coordinate is taken modulo ``2**64``, so a negative int or one of ``2**63`` or
more means the same in a Python int and in an int64 tensor. Since ``hash64(key, a, b) ==
absorb(hash64(key, a), b)``, a caller may hash the leading coordinates once and absorb
the rest per message or per tensor element; the tensor functions accept such a hash as
their key (an int64 tensor of words). :func:`hash64`, :func:`absorb` and :func:`mix64`
are those tensor functions on one element, for callers that hold Python ints (a fault
plan deciding one message), returning the word as an int in ``[0, 2**64)``.

Draws from the words of the coordinates:

* :func:`uniform_tensor`: ``(h >> 11) / 2**53``, a float64 in [0, 1) with 53 random bits;
* :func:`gaussian_pair_tensor`: two independent standard normals by Box–Muller from the
  words of ``coords`` and ``(coords, 0)`` (:func:`gaussian_tensor`: the first of them);
* :func:`logistic_tensor`: a standard logistic ``log(u / (1 - u))`` (so ``[z > L]`` is
  Bernoulli(sigmoid(z))).

These need logarithms, square roots, sines and cosines, and Python's libm, torch's CPU
kernels and CUDA do not round them alike (torch's CPU ``sqrt`` and ``log`` even differ
from correctly rounded results, and its ``sigmoid`` rounds an element differently in the
SIMD body of a tensor and in its tail). So this module computes them itself from
operations IEEE 754 rounds exactly (``+ - * /``, exact exponent and mantissa extraction,
power-of-two scaling), hence the same bits on every device. They are accurate to a few
units in the last place (Taylor series and Newton steps, see the private helpers), which
is all a draw needs.

:func:`string_id` turns a name (a node id, a fault kind) into a stable 64-bit coordinate.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import TypeAlias

import torch

__all__ = [
    "MASK64",
    "Coordinate",
    "absorb",
    "absorb_tensor",
    "gaussian_pair_tensor",
    "gaussian_tensor",
    "hash64",
    "hash64_tensor",
    "log_tensor",
    "logistic_tensor",
    "make_key",
    "mix64",
    "mix64_tensor",
    "signed64",
    "sin_cos_tensor",
    "sqrt_tensor",
    "string_id",
    "string_ids",
    "uniform_tensor",
]

MASK64 = (1 << 64) - 1
"""The low 64 bits."""

Coordinate: TypeAlias = int | torch.Tensor
"""An integer coordinate: a Python int, or an integer tensor that broadcasts."""

_GAMMA = 0x9E3779B97F4A7C15  # 2**64 / golden ratio, odd: splitmix64's increment
_STEP = 0xD1342543DE82EF95  # an odd multiplier of good spectral quality modulo 2**64
_M1 = 0xBF58476D1CE4E5B9  # the two multipliers of splitmix64's finalizer
_M2 = 0x94D049BB133111EB
_MASK52 = (1 << 52) - 1
_MASK53 = (1 << 53) - 1
_SIGN = -(1 << 63)  # the sign bit of an int64 (and of a float64 viewed as one)
_CPU = torch.device("cpu")


def signed64(value: int) -> int:
    """The int64 whose bits are the low 64 bits of ``value`` (what an int64 tensor holds)."""
    value &= MASK64
    return value - (1 << 64) if value >> 63 else value


_GAMMA_S, _STEP_S, _M1_S, _M2_S = map(signed64, (_GAMMA, _STEP, _M1, _M2))


# --- constants of the arithmetic both forms share --------------------------------------------


def _exact(numerator: int, denominator: int = 1) -> float:
    """``numerator / denominator`` correctly rounded to float64."""
    return float(Fraction(numerator, denominator))


def _split(value: Fraction, parts: int, bits: int) -> tuple[float, ...]:
    """``value`` as a sum of ``parts`` floats, all but the last of ``bits`` significant bits."""
    out: list[float] = []
    rest = value
    for _ in range(parts - 1):
        exponent = math.floor(math.log2(abs(rest)))
        scale = Fraction(2) ** (bits - 1 - exponent)
        head = Fraction(round(rest * scale)) / scale
        out.append(float(head))
        rest -= head
    out.append(float(rest))
    return tuple(out)


_PI = Fraction("3.141592653589793238462643383279502884197169399375105821")
_LN2 = Fraction("0.6931471805599453094172321214581765680755001343602552541")
_HALF_PI = float(_PI / 2)
_TWO_OVER_PI = float(2 / _PI)
# pi/2 in four parts (Cody–Waite): n * part is exact for |n| < 2**29 (24-bit parts).
_PIO2 = _split(_PI / 2, 4, 24)
# ln 2 in two parts: e * _LN2_HI is exact for every float64 exponent e.
_LN2_HI, _LN2_LO = _split(_LN2, 2, 32)
_SQRT_HALF = _exact(7071067811865475244, 10**19)
# m < _SQRT_HALF, for m in [1/2, 1), compares the mantissa bits (same exponent).
_SQRT_HALF_MANTISSA = int(_SQRT_HALF * 2.0**53) & _MASK52
# log m = 2 s (1 + s^2/3 + s^4/5 + ...), s = (m - 1)/(m + 1), |s| <= 0.1716: 11 terms
# leave less than 3e-17.
_LOG_SERIES = tuple(_exact(1, 2 * k + 1) for k in range(10, -1, -1))
# |phi| <= pi/4: sin to phi^17 and cos to phi^18 leave less than 1e-18.
_SIN_SERIES = tuple(_exact((-1) ** k, math.factorial(2 * k + 1)) for k in range(8, -1, -1))
_COS_SERIES = tuple(_exact((-1) ** k, math.factorial(2 * k)) for k in range(9, -1, -1))
# sqrt(m) on [1/2, 2) within 1.6% (a fitted quadratic); three Newton steps then leave
# less than 3e-17.
_SQRT_GUESS = (-0.1003, 0.7085, 0.3888)


# --- Python ints: the tensor form on one element ----------------------------------------------


def mix64(z: int) -> int:
    """:func:`mix64_tensor` of one word: an int in ``[0, 2**64)``."""
    return _word(mix64_tensor(torch.tensor(signed64(z), device=_CPU)))


def absorb(h: int, c: int) -> int:
    """:func:`absorb_tensor` of one hash and coordinate: an int in ``[0, 2**64)``."""
    return _word(absorb_tensor(torch.tensor(signed64(h), device=_CPU), c))


def hash64(key: int, *coords: int) -> int:
    """:func:`hash64_tensor` of int coordinates: an int in ``[0, 2**64)``."""
    return _word(hash64_tensor(key, *coords))


def _word(t: torch.Tensor) -> int:
    """The unsigned 64-bit word a one-element int64 tensor holds."""
    return int(t) & MASK64


@functools.lru_cache(maxsize=1 << 17)
def string_id(text: str) -> int:
    """A stable 64-bit id of ``text``: its 8-byte BLAKE2b digest (UTF-8), little-endian.

    Cached: a node id costs one dictionary look-up after the first call.
    """
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def make_key(domain: str, *seeds: int) -> int:
    """A key for one use of some seeds: ``hash64(string_id(domain), *seeds)``.

    Different domains (``"fedcore.faults"``, ...) give unrelated numbers from one seed.
    """
    return hash64(string_id(domain), *seeds)


# --- tensor form ------------------------------------------------------------------------------


def mix64_tensor(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer of every word of the integer tensor ``z`` (a new int64
    tensor): a bijection with full avalanche."""
    return _mix_(z.to(torch.int64, copy=True))


def absorb_tensor(h: Coordinate, c: Coordinate) -> torch.Tensor:
    """The hash ``h`` extended by the coordinate ``c`` (both taken modulo ``2**64``),
    elementwise, broadcasting ``h`` and ``c`` (at least one a tensor).

    Raises:
        TypeError: both are ints (use :func:`absorb`).
    """
    if isinstance(c, int):
        if isinstance(h, int):
            raise TypeError("absorb_tensor needs a tensor; use absorb for two ints")
        z = h.to(torch.int64) + signed64(c * _STEP + _GAMMA)
    else:
        z = c.to(torch.int64) * _STEP_S
        z += _GAMMA_S
        if isinstance(h, int):
            z += signed64(h)
        else:
            z = z + h.to(torch.int64)
    return _mix_(z)


def hash64_tensor(
    key: Coordinate, *coords: Coordinate, device: torch.device | str | None = None
) -> torch.Tensor:
    """The words of ``coords`` under ``key``, broadcast: an int64 tensor of the broadcast
    shape, each element holding the word's bits.

    ``key`` is an int, or an int64 tensor of words (the hash of leading coordinates). An
    int key starts as a 0-dimensional tensor on ``device`` (default CPU), so without any
    tensor coordinate the result is one there; a tensor coordinate's device takes over.
    """
    if not isinstance(key, torch.Tensor):
        if device is None:  # a tensor coordinate's device, else the CPU (never torch's default)
            tensors = (c.device for c in coords if isinstance(c, torch.Tensor))
            device = next(tensors, _CPU)
        key = torch.tensor(signed64(key), device=device)
    h = key
    for c in coords:
        h = absorb_tensor(h, c)
    return h


def uniform_tensor(
    key: Coordinate, *coords: Coordinate, device: torch.device | str | None = None
) -> torch.Tensor:
    """Uniform float64 draws in [0, 1) with 53 random bits, ``(hash64 >> 11) / 2**53``,
    over broadcast coordinates."""
    return _word_uniform(hash64_tensor(key, *coords, device=device))


def gaussian_pair_tensor(
    key: Coordinate, *coords: Coordinate, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two independent standard normal draws (float64) over broadcast coordinates:
    Box–Muller of the words of ``coords`` and ``(coords, 0)``, ``r (cos theta, sin theta)``
    with ``r = sqrt(-2 log x)``.

    ``x = (k + 1/2) / 2**52`` from the top 52 bits of the first word (never 0 or 1, so
    ``r`` is finite and positive); the angle ``theta = q pi/2 + phi`` from the second:
    the quadrant ``q`` from its low two bits, ``phi = pi/2 (f - 1/2)`` from its top 53
    (``f`` uniform in [0, 1)), so ``theta`` is uniform on the circle and ``|phi| <= pi/4``
    where the series converge fast.
    """
    w1 = hash64_tensor(key, *coords, device=device)
    w2 = absorb_tensor(w1, 0)
    k = w1 >> 12
    k &= _MASK52
    x = k.to(torch.float64)
    x += 0.5
    x *= 2.0**-52
    y = _log_positive(x)
    y *= -2.0
    r = _sqrt_positive(y)
    phi = _word_uniform(w2)
    phi -= 0.5
    phi *= _HALF_PI
    s, c = _sin_cos_core_(phi)
    sin_theta, cos_theta = _quadrant_(s, c, w2 & 3)
    return r * cos_theta, r.mul_(sin_theta)


def gaussian_tensor(
    key: Coordinate, *coords: Coordinate, device: torch.device | str | None = None
) -> torch.Tensor:
    """A standard normal draw (float64): the first of :func:`gaussian_pair_tensor`."""
    return gaussian_pair_tensor(key, *coords, device=device)[0]


def logistic_tensor(
    key: Coordinate, *coords: Coordinate, device: torch.device | str | None = None
) -> torch.Tensor:
    """Standard logistic draws ``log(u / (1 - u))`` (float64) over broadcast coordinates,
    ``u = (2k + 1) / 2**53`` from the top 52 bits ``k`` of the word, so ``u`` is in (0, 1).

    ``P(logistic < z) = sigmoid(z)``: the label ``[z > logistic]`` is Bernoulli(sigmoid(z))
    (it is the event ``u < sigmoid(z)``), with no exponential to round.
    """
    # log(2k + 1) - log(2**53 - 2k - 1): both integers below 2**53, exact in float64.
    k = hash64_tensor(key, *coords, device=device) >> 12
    k &= _MASK52
    k <<= 1
    k += 1
    j = k.to(torch.float64)
    out = _log_positive(j)
    out -= _log_positive(2.0**53 - j)
    return out


def log_tensor(x: torch.Tensor) -> torch.Tensor:
    """The natural logarithm, elementwise (float64); ``-inf`` at 0, NaN below."""
    x = x.to(torch.float64)
    m, e = torch.frexp(x)
    small = m < _SQRT_HALF
    m = torch.where(small, m * 2.0, m)
    out = _log_core_(m, (e - small.to(e.dtype)).to(torch.float64))
    return torch.where(x > 0, out, torch.where(x == 0, -math.inf, math.nan))


def sqrt_tensor(y: torch.Tensor) -> torch.Tensor:
    """The square root, elementwise (float64); NaN below 0."""
    y = y.to(torch.float64)
    m, e = torch.frexp(y)
    odd = (e & 1).bool()
    m = torch.where(odd, m * 2.0, m)
    half = (e.to(torch.int64) - odd.to(torch.int64)) >> 1
    out = _sqrt_core_(m) * _power_of_two(half)
    return torch.where(y > 0, out, torch.where(y == 0, y, math.nan))


def sin_cos_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sin x, cos x)`` elementwise (two float64 tensors).

    Accurate to a few units in the last place for ``|x|`` up to about ``8e8``; beyond,
    the argument reduction loses bits (the results stay deterministic).
    """
    x = x.to(torch.float64)
    n = x * _TWO_OVER_PI
    n += 0.5
    n = torch.floor(n)
    s, c = _sin_cos_core_(_reduce_(x, n))
    return _quadrant_(s, c, n.to(torch.int64) & 3)


def string_ids(texts: Iterable[str], device: torch.device | str | None = None) -> torch.Tensor:
    """:func:`string_id` of each text, as an int64 tensor (the ids' bits)."""
    ids = [signed64(string_id(text)) for text in texts]
    return torch.tensor(ids, dtype=torch.int64, device=device)


def _mix_(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer in place on an int64 tensor; each right shift masked to a
    logical one."""
    t = z >> 30
    t &= (1 << 34) - 1
    z ^= t
    z *= _M1_S
    torch.bitwise_right_shift(z, 27, out=t)
    t &= (1 << 37) - 1
    z ^= t
    z *= _M2_S
    torch.bitwise_right_shift(z, 31, out=t)
    t &= (1 << 33) - 1
    z ^= t
    return z


def _word_uniform(w: torch.Tensor) -> torch.Tensor:
    k = w >> 11
    k &= _MASK53
    u = k.to(torch.float64)
    u *= 2.0**-53
    return u


def _power_of_two(n: torch.Tensor) -> torch.Tensor:
    """``2.0**n`` for int64 ``n`` in the normal range, built from its bits: exact."""
    return ((n + 1023) << 52).view(torch.float64)


def _log_positive(x: torch.Tensor) -> torch.Tensor:
    """:func:`log_tensor` of float64 positive normal numbers (not checked), from their bits.

    ``x = (1 + f) 2**(E - 1023)``; the mantissa bits of ``m = (1 + f)/2`` tell whether
    ``m < sqrt(1/2)``, and then ``m`` doubles and the exponent drops by one: the
    ``frexp`` and reduction of :func:`log_tensor`, in integer operations.
    """
    bits = x.view(torch.int64)
    mantissa = bits & _MASK52
    below = mantissa - _SQRT_HALF_MANTISSA
    below >>= 63  # -1 where m < sqrt(1/2), else 0
    e = bits >> 52
    e -= 1022
    e += below
    m = (1022 - below) << 52
    m |= mantissa
    return _log_core_(m.view(torch.float64), e.to(torch.float64))


def _sqrt_positive(y: torch.Tensor) -> torch.Tensor:
    """:func:`sqrt_tensor` of float64 positive normal numbers (not checked), from their bits.

    ``y = m 2**e`` with ``m`` in [1/2, 1), ``e = E - 1022``; for an odd ``e`` (odd ``E``)
    ``m`` doubles: ``m`` gets the biased exponent ``1022 + (E & 1)``.
    """
    bits = y.view(torch.int64)
    biased = bits >> 52
    odd = biased & 1
    m = (odd + 1022) << 52
    m |= bits & _MASK52
    biased -= 1022
    biased -= odd
    biased >>= 1
    return _sqrt_core_(m.view(torch.float64)).mul_(_power_of_two(biased))


def _quadrant_(
    s: torch.Tensor, c: torch.Tensor, q: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sin, cos)`` of ``q pi/2 + phi`` from ``s, c = sin phi, cos phi``: selections and
    sign flips on the bits (exact)."""
    s_bits, c_bits = s.view(torch.int64), c.view(torch.int64)
    swap = s_bits ^ c_bits
    swap &= -(q & 1)  # all ones where q is odd: sin and cos trade places
    sin_q = s_bits ^ swap
    cos_q = c_bits ^ swap
    sin_q ^= ((q >> 1) & 1) * _SIGN
    cos_q ^= ((q ^ (q >> 1)) & 1) * _SIGN
    return sin_q.view(torch.float64), cos_q.view(torch.float64)


def _log_core_(m: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``log(m * 2**e)`` for ``m`` in [sqrt(1/2), sqrt(2)) (overwrites ``e``): ``e ln 2 +
    2 s (1 + s^2/3 + ...)``, ``s = (m - 1)/(m + 1)``, ``ln 2`` in two parts."""
    s = m - 1.0
    s /= m + 1.0
    series = _horner_(s * s, _LOG_SERIES)
    s += s
    s *= series
    low = e * _LN2_LO
    low += s
    e *= _LN2_HI
    e += low
    return e


def _sqrt_core_(m: torch.Tensor) -> torch.Tensor:
    """``sqrt(m)`` for ``m`` in [1/2, 2): a quadratic guess, three Newton steps."""
    g = _horner_(m, _SQRT_GUESS)
    for _ in range(3):
        step = m / g
        step += g
        step *= 0.5
        g = step
    return g


def _sin_cos_core_(phi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sin phi, cos phi)`` for ``|phi|`` up to about pi/4, by their series."""
    phi2 = phi * phi
    s = _horner_(phi2, _SIN_SERIES)
    s *= phi
    return s, _horner_(phi2, _COS_SERIES)


def _reduce_(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """``x - n pi/2``, each product exact (Cody–Waite)."""
    p1, p2, p3, p4 = _PIO2
    r = x - n * p1
    r -= n * p2
    r -= n * p3
    r -= n * p4
    return r


def _horner_(x: torch.Tensor, coefficients: Sequence[float]) -> torch.Tensor:
    """The polynomial of ``coefficients`` (highest power first) at ``x``."""
    p = x * coefficients[0]
    p += coefficients[1]
    for c in coefficients[2:]:
        p *= x
        p += c
    return p
