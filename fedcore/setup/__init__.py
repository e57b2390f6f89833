"""Set-up: how a config becomes what every peer of a run shares, before any engine runs.

* :mod:`~fedcore.setup.prepare`: the run plan (graph, weights, fingerprint, the cheap
  checks) and the set-up on top of it (data, partition, model);
* :mod:`~fedcore.setup.checkpoint`: a node's state to and from disk.
"""
