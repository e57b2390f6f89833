"""The two in-process engines that run a prepared set-up:
:mod:`~fedcore.engines.messages` (a node object per peer, messages over an in-process
transport) and :mod:`~fedcore.engines.vectorized` (every peer as a row of one stack)."""
