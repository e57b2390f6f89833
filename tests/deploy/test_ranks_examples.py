"""The examples of a sharded run across machines (``examples/ranks/``), checked offline:

- ``job.yaml`` (a Kubernetes Indexed Job and its headless Service) validates against the
  Kubernetes schemas, as ``fedcore k8s``'s manifests do; its container's command is one that
  torchrun's own parser and fedcore's accept, and its rendezvous address is the first pod's
  name on the Service;
- ``slurm.sh`` runs for real, with stand-ins for Slurm's ``scontrol`` and ``srun`` (two
  "nodes" on this machine, the rendezvous on a free port of 127.0.0.1), and its run equals
  one process bit for bit.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from torch.distributed.run import get_args_parser

from fedcore.cli.app import parser
from fedcore.config import config_to_dict, dumps_toml, load_config
from fedcore.simulation.simulate import simulate
from tests.deploy.test_k8s import VERSIONS

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "ranks"


def _fedcore_args(torchrun_args: list[str]) -> tuple[Any, Any]:
    """torchrun's parse of ``torchrun_args``, and fedcore's of the module's arguments."""
    args = get_args_parser().parse_args(torchrun_args)
    assert args.module and args.training_script == "fedcore", torchrun_args
    return args, parser().parse_args(args.training_script_args)


def test_the_kubernetes_job_validates_and_its_ranks_meet_at_pod_0() -> None:
    documents = list(yaml.safe_load_all((EXAMPLES / "job.yaml").read_text(encoding="utf-8")))
    for document in documents:
        for version in VERSIONS:
            try:
                kubernetes_validate.validate(document, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(
                    f"{document['kind']} is invalid for Kubernetes {version}: {exc.message}"
                )
    service, job = documents
    assert (service["kind"], job["kind"]) == ("Service", "Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    pod = spec["template"]["spec"]
    assert (
        pod["subdomain"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
    )
    (container,) = pod["containers"]
    assert container["command"] == ["torchrun"]
    argv = [a.replace("$(JOB_COMPLETION_INDEX)", "1") for a in container["args"]]
    args, ours = _fedcore_args(argv)
    assert int(args.nnodes) == spec["completions"] and args.node_rank == 1
    assert args.master_addr == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    assert args.master_port == service["spec"]["ports"][0]["port"]
    assert ours.command == "simulate" and ours.config.startswith("/fedcore/run/")
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/fedcore/run" in mounts and any(ours.out.startswith(m) for m in mounts)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stand_in(folder: Path, name: str, text: str) -> None:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_the_slurm_script_runs_two_ranks_equal_to_one_process(tmp_path: Path) -> None:
    script = EXAMPLES / "slurm.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text(encoding="utf-8")
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # Slurm's commands as this machine's: one host name, and srun that starts its command
    # once a node (two), as srun with --ntasks-per-node=1 does.
    _stand_in(bin_dir, "scontrol", "#!/bin/bash\necho 127.0.0.1\n")
    _stand_in(bin_dir, "srun", '#!/bin/bash\n"$@" &\n"$@" &\nwait -n && wait -n\n')
    config = load_config(
        None,
        ["algorithm.name=dpsgd", "topology.kind=ring", "topology.nodes=6", "run.rounds=5"],
    )
    config_path = tmp_path / "run.toml"
    config_path.write_text(dumps_toml(config_to_dict(config)), encoding="utf-8")
    env = {
        **os.environ,
        "PATH": os.pathsep.join(
            [str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]
        ),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        "SLURM_JOB_NODELIST": "node[1-2]",
        "SLURM_NNODES": "2",
        "SLURM_JOB_ID": "77",
        "FEDCORE_RENDEZVOUS_PORT": str(_free_port()),
    }
    ran = subprocess.run(
        ["bash", str(script), str(config_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    ranked = json.loads((tmp_path / "runs" / "ranks-77" / "summary.json").read_text("utf-8"))
    one = simulate(config, out_dir=tmp_path / "one", show_progress=False)
    assert ranked["ranks"] == 2 and ranked["params_sha256"] == one["params_sha256"]
