"""The Flower side of ``benchmarks/versus_flower.py``: one run of a workload in Flower's
simulation engine, written as a Flower user writes it (Message API, ``ServerApp`` with
the built-in ``FedAvg`` strategy, ``ClientApp`` with a ``@train`` function,
``flwr.simulation.run_simulation`` on the Ray backend).

It runs in the interpreter that has ``flwr[simulation]`` (never fedcore's), so it imports
only Flower, torch and numpy. ``versus_flower.py`` starts it as its own process::

    FLOWER_PYTHON benchmarks/versus_flower_flwr.py --spec SPEC.json --result OUT.json

``SPEC.json`` names the workload and the ``.npz`` file with the data exactly as fedcore
partitioned it (``x_train``, ``y_train``, and each client's example indices as
``part_index``/``part_offsets``). ``OUT.json`` gets the wall-clock time (``time.time()``)
at which each round's aggregate was ready, read from ``FedAvg.start``'s ``evaluate_fn``
(called with round 0 before training and after every round), which evaluates nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from torch import nn
from torch.nn import functional

_SPEC: dict[str, Any] = json.loads(os.environ.get("VERSUS_FLOWER_SPEC", "{}"))
"""The workload (the Ray actors are other processes: they read it from the environment)."""

_DATA: dict[str, np.ndarray] = {}
"""The data, loaded once per process (each Ray actor holds its own)."""


def _data() -> dict[str, np.ndarray]:
    if not _DATA:
        with np.load(_SPEC["data"]) as npz:
            _DATA.update({key: npz[key] for key in npz.files})
    return _DATA


def _net(input_dim: int, hidden: int, classes: int) -> nn.Module:
    """The workload's MLP: linear, ReLU, linear (the same layers as fedcore's ``mlp``)."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(input_dim, hidden), nn.ReLU(), nn.Linear(hidden, classes)
    )


def _new_net() -> nn.Module:
    return _net(int(_SPEC["input_dim"]), int(_SPEC["hidden"]), int(_SPEC["classes"]))


client = ClientApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    """``local_steps`` SGD steps of ``batch_size`` on this client's part, from the
    global model; reply with the model and the part's example count (FedAvg's weight)."""
    data = _data()
    pid = int(context.node_config["partition-id"])
    lo, hi = int(data["part_offsets"][pid]), int(data["part_offsets"][pid + 1])
    idx = torch.from_numpy(data["part_index"][lo:hi])
    x = torch.from_numpy(data["x_train"])[idx]
    y = torch.from_numpy(data["y_train"])[idx]
    model = _new_net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=float(_SPEC["lr"]))
    batch = min(int(_SPEC["batch_size"]), len(x))
    gen = torch.Generator().manual_seed(int(_SPEC["seed"]) * 1_000_003 + pid)
    order = torch.randperm(len(x), generator=gen)
    pos = 0
    model.train()
    loss = torch.zeros(())
    for _ in range(int(_SPEC["local_steps"])):
        if pos + batch > len(x):
            order, pos = torch.randperm(len(x), generator=gen), 0
        take = order[pos : pos + batch]
        pos += batch
        opt.zero_grad()
        loss = functional.cross_entropy(model(x[take]), y[take])
        loss.backward()
        opt.step()
    metrics = MetricRecord({"train_loss": loss.item(), "num-examples": len(x)})
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=content, reply_to=msg)


server = ServerApp()

_STAMPS: list[float] = []
"""``time.time()`` when each round's aggregate was ready (index 0: before round 1)."""


@server.main()
def main(grid: Grid, context: Context) -> None:
    """FedAvg over ``clients`` nodes, ``fraction`` of them trained each round, no
    federated evaluation; the server's ``evaluate_fn`` only notes the time."""
    clients = int(_SPEC["clients"])
    sampled = max(1, round(float(_SPEC["fraction"]) * clients))
    strategy = FedAvg(
        fraction_train=float(_SPEC["fraction"]),
        fraction_evaluate=0.0,
        min_train_nodes=sampled,
        min_evaluate_nodes=0,
        min_available_nodes=clients,
    )
    torch.manual_seed(int(_SPEC["seed"]))

    def stamp(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        _STAMPS.append(time.time())
        return None

    strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(_new_net().state_dict()),
        num_rounds=int(_SPEC["rounds"]),
        evaluate_fn=stamp,
    )


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--result", required=True, type=Path)
    args = parser.parse_args()
    _SPEC.update(json.loads(args.spec.read_text(encoding="utf-8")))
    os.environ["VERSUS_FLOWER_SPEC"] = json.dumps(_SPEC)  # the actors start after this
    torch.set_num_threads(int(_SPEC["threads"]))
    cpus = float(_SPEC["client_cpus"])
    run_simulation(
        server_app=server,
        client_app=client,
        num_supernodes=int(_SPEC["clients"]),
        backend_config={"client_resources": {"num_cpus": cpus, "num_gpus": 0.0}},
    )
    import flwr

    result = {
        "stamps": _STAMPS[1:],
        "ready": _STAMPS[0] if _STAMPS else None,
        "version": flwr.__version__,
        "torch": torch.__version__,
    }
    args.result.write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    _main()
