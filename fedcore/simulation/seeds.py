"""The seeds of a sweep as ``--seeds`` gives them (``0-4``, ``0,3,7``, ``0-2,5``), and as the
shortest such text that can name a folder (``0-2_5``)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from fedcore.errors import ConfigError
from fedcore.ids import clip

MAX_SEEDS = 1000
"""Most seeds one sweep runs."""


_SEED_FORMS = "give N, A-B (inclusive) or a comma list of them, e.g. 2, 0-4, 0,3,7 or 0-2,5"
_SEED_PART = re.compile(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?")
_SEED_LIMIT = 2**32


def parse_seeds(text: str) -> list[int]:
    """The seeds of ``--seeds TEXT``: ``2``, ``0-4`` (inclusive), ``0,3,7``, ``0-2,5``.

    Raises:
        ConfigError: text in none of these forms, a range that runs backwards, a seed
            listed twice, a seed outside ``[0, 2**32)`` or more than :data:`MAX_SEEDS`.
    """
    where = f"--seeds {clip(text, 40)}"
    seeds: list[int] = []
    seen: set[int] = set()
    for part in text.split(","):
        match = _SEED_PART.fullmatch(part)
        if match is None:
            what = "an empty item" if not part.strip() else f"{clip(part.strip(), 20)}"
            raise ConfigError(f"{where}: {what} is not a seed or a range; {_SEED_FORMS}.")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise ConfigError(f"{where}: the range {low}-{high} runs backwards; {_SEED_FORMS}.")
        if high >= _SEED_LIMIT:
            raise ConfigError(f"{where}: seeds must be in [0, 2**32), not {high}.")
        if len(seeds) + high - low + 1 > MAX_SEEDS:
            raise ConfigError(f"{where}: more than {MAX_SEEDS} seeds; sweep fewer at a time.")
        for seed in range(low, high + 1):
            if seed in seen:
                raise ConfigError(f"{where}: seed {seed} is listed twice; list each seed once.")
            seen.add(seed)
            seeds.append(seed)
    return seeds


def format_seeds(seeds: Iterable[int]) -> str:
    """Seeds as the shortest ``--seeds`` text, ranges joined by ``_`` so it can name a
    folder: ``[0, 1, 2, 5]`` -> ``0-2_5``."""
    parts: list[list[int]] = []
    for seed in sorted(seeds):
        if parts and seed == parts[-1][1] + 1:
            parts[-1][1] = seed
        else:
            parts.append([seed, seed])
    return "_".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)
