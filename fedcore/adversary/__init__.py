"""Peers that lie: attacks as peer behaviours (``[adversary]``).

:func:`~fedcore.adversary.rule.attacked` wraps a run's rule so that the rows of its
Byzantine peers (:func:`~fedcore.adversary.choose.byzantine`) send what the attack says
(:mod:`fedcore.adversary.attacks`); every engine runs the wrapped rule as any rule.
"""

from __future__ import annotations

from fedcore.adversary.choose import Liars, byzantine
from fedcore.adversary.rule import Attacked, attacked

__all__ = ["Attacked", "Liars", "attacked", "byzantine"]
