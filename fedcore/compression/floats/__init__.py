"""Low-precision float codecs: ``fp8``, ``float`` (any exponent and mantissa width), ``s2fp8``.

Each is a real packed encoding with an exact wire size (``nbytes(n)``, what
``EncodedTensor.nbytes`` counts: payload plus 8 bytes per header scalar). All three are
deterministic, and all three refuse non-finite input with
:class:`~fedcore.errors.CompressionError` (as ``qsgd`` does: a scale or a format without
inf and NaN cannot carry them). Decoding checks the header against the bytes and refuses
codes the format does not define (NaN and inf codes, a reserved exponent, padding bits).

Wire formats (little-endian; ``n`` values; float32 scales):

=======  ===============================================  ======================  =========
codec    data                                             params                  nbytes
=======  ===============================================  ======================  =========
fp8      ``n`` float8 bytes (e4m3fn or e5m2), then one    ``exp_bits`` (4 or 5),  n + 4 s
         float32 scale per tensor (``chunk = 0``) or      ``chunk`` if chunked    + 8 p
         per ``chunk`` values: ``s`` scales
float    ``ceil(n (1 + e + m) / 8)`` bytes: value ``i``   ``exp_bits``,           payload
         in bits ``[i w, (i + 1) w)`` of the stream,      ``man_bits``            + 16
         low bit first; sign, exponent, mantissa from
         the top bit down
s2fp8    alpha, beta (two float32), then ``n`` e5m2       none                    n + 8
         bytes
=======  ===============================================  ======================  =========

``fp8`` scales each tensor (or chunk) so that its largest magnitude maps to the format's
largest finite value (448 for e4m3fn, 57344 for e5m2), casts with torch's
``float8_e4m3fn`` / ``float8_e5m2``, and multiplies back.

``float`` is the customized precision (CPD) of Han, Demmel and You: ``e`` exponent bits with
bias ``2**(e-1) - 1``, ``m`` mantissa bits, round to nearest even, subnormals. As in IEEE the
all-ones exponent is reserved (never sent, refused on decode), so e=8/m=23 is exactly
float32 and e=5/m=10 exactly float16 on every finite value a float16 can hold, normals and
subnormals alike. Unlike IEEE there is no inf: a value beyond the largest finite value
saturates to it (float16 would round ``|x| >= 65520`` to inf; this codec sends 65504).
With ``scaling = "aps"`` (Auto-Precision Scaling, Han, Demmel and You) each layer of the
model is first multiplied by ``2**s``, ``s`` from its largest magnitude (:func:`aps_shift`:
the largest value lands in the format's top binade), so that small layers are not
flushed to zero; the data then starts with one ``(uint32 numel, int16 s)`` record per
layer (``layers`` records, a third header scalar; nbytes ``+ 6 layers + 8``), and the
decoder divides by ``2**s`` exactly. A tensor that is not the whole model (an RPS block)
is one layer.

``s2fp8`` (Cambier et al., ICLR 2020) takes over the non-zero values ``L = log2|x|``,
``mu = mean L``, ``M = max L``, ``alpha = 15 / (M - mu)`` (1 when ``M = mu``),
``beta = -alpha mu`` (both rounded to float32 first, so both ends use the same), sends
``sign(x) * e5m2(2**(alpha L + beta))`` and decodes ``|x| = 2**((log2|y| - beta) / alpha)``.
Zeros stay zeros; a non-zero value too small for e5m2 (below its least subnormal
``2**-16`` in the shifted domain) is sent as that subnormal, so that signs and non-zeros
survive.

Speed. The codecs work on the float32 bit patterns, not through float64 frexp chains:
fp8 and ``float`` e4m3 / e5m2 / e5m10 / e8m7 round with torch's own casts (which round to
nearest even, as the format does; values are clamped to the format's largest finite value
first, which is its saturation); other ``float`` formats with at most 5 mantissa bits look
the code up from the top 16 bits of the value with the low 16 folded into the last bit
(round to odd, which a later rounding to 5 or fewer bits cannot tell from the value
itself), the rest round with integer arithmetic on the bits. Decoding looks values up in
a table of every code (or of every byte: two 4-bit codes at once). s2fp8 decodes through
a 256-entry table when torch's vectorized and scalar ``log2``/``exp2`` agree on its
entries (otherwise value by value, as before). Everything is bit-identical to the slow
reference (``tests/compression/test_floats_fast.py``).

One module a codec: :mod:`~fedcore.compression.floats.fp8` (with what the three share),
:mod:`~fedcore.compression.floats.custom` (``float``) and
:mod:`~fedcore.compression.floats.s2fp8`.
"""

from __future__ import annotations

from fedcore.compression.floats.custom import APS_MAX_SHIFT, CustomFloatCodec, aps_shift
from fedcore.compression.floats.fp8 import FP8_FORMATS, FP8Codec
from fedcore.compression.floats.s2fp8 import S2FP8Codec

__all__ = [
    "APS_MAX_SHIFT",
    "FP8_FORMATS",
    "CustomFloatCodec",
    "FP8Codec",
    "S2FP8Codec",
    "aps_shift",
]
