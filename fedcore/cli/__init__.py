"""The ``fedcore`` command line: the only place that configures logging. One module a
subcommand (its options and its handler); :mod:`~fedcore.cli.common` has what they share.

Subcommands::

    fedcore simulate [CONFIG.toml] [--out DIR] [--set KEY=VALUE ...] [--quiet]
    fedcore launch [CONFIG.toml] [--out DIR] [--set KEY=VALUE ...] [--peers-per-process K]
                   [--quiet]
    fedcore node --config FILE --id ID[,ID...] --roster FILE [--listen HOST:PORT] [--out DIR]
    fedcore compose [CONFIG.toml] --out DIR [--set KEY=VALUE ...] [--image NAME] [--port N]
                    [--nodes ID,ID --roster FILE]
    fedcore k8s [CONFIG.toml] --out DIR [--set KEY=VALUE ...] [--image NAME] [--port N]
                [--namespace NS] [--name NAME] [--cpu Q] [--memory Q] [--storage Q] ...
    fedcore summarize RUN_DIR [--config FILE] [--quiet]
    fedcore certs init (--nodes ID... | --config FILE) --out DIR [--days N] [--force]
    fedcore health HOST:PORT [--config FILE --id ID] [--timeout S]
    fedcore topology show SPEC|FILE
    fedcore plot RUN_DIR... --out FILE.png

Errors become one line on stderr, never a traceback: exit status 2 for invalid input (bad
config, unknown name, invalid graph file, an output path that cannot be written) and 1 for
a run that fails on its way (a strict-mode peer that never answered).
"""

from __future__ import annotations

from fedcore.cli.app import main

__all__ = ["main"]
