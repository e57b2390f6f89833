"""The tables of a config file, one frozen dataclass each, grouped by concern: ``run``
(``[run]``), ``topology``, ``learning`` (``[algorithm]``, ``[optimizer]``, ``[model]``),
``data``, ``network`` (``[compression]``, ``[transport]``), ``faults``, ``time``,
``privacy`` and ``simulate``. Each key's choices and ranges are declared once, on its field
(:mod:`fedcore.config.rules`); :mod:`fedcore.config.experiment` puts the tables together."""
