"""Set-up: how a config becomes what every peer of a run shares, before any engine runs.

* :mod:`~fedcore.setup.plan`: the run plan (algorithm, graph, weights, fingerprint, the
  cheap checks), each step given only its part of the config;
* :mod:`~fedcore.setup.graph`: the trust graph and its weights, checked early;
* :mod:`~fedcore.setup.prepare`: the set-up on top of the plan (data, partition, model);
* :mod:`~fedcore.setup.training`: the training data and the objective;
* :mod:`~fedcore.setup.checkpoint`: a node's state to and from disk.
"""
