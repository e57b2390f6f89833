"""The launcher of ``fedcore simulate --ranks R`` loads no torch before it starts the ranks
(each rank loads its own; the launcher's would be seconds before any rank starts)."""

from __future__ import annotations

import subprocess
import sys


def test_the_launcher_of_ranks_imports_no_torch() -> None:
    code = (
        "import sys; import fedcore.cli.simulate, fedcore.engines.shard_refusal, "
        "fedcore.simulation.rank_launch; sys.exit(3 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_the_refusals_are_the_sharded_engines() -> None:
    """One set of refusals, whichever module a caller reads them from."""
    from fedcore.engines import partition, shard_refusal, sharded

    assert sharded.config_refusal is shard_refusal.config_refusal
    assert sharded.SHARDED_ALGORITHMS is shard_refusal.SHARDED_ALGORITHMS
    assert partition.metis_available is shard_refusal.metis_available
