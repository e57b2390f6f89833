"""The test shown in docs/writing-your-own.md ("Testing your own algorithm or model"), kept
here so the page cannot drift from the code."""

from __future__ import annotations

from fedcore.testing import make_network


def test_my_model_learns_on_a_one_way_graph() -> None:
    net = make_network(
        "social:8",
        algorithm="ops",
        model="logreg",
        settings={"algorithm.lr": 0.5, "data.partition": "iid"},
    )
    net.run(60)
    assert net.evaluate()["avg_model_accuracy"] > 0.9
    # Every message travelled along a trust edge.
    assert all(m.sender in net.graph.in_neighbours(m.receiver) for m in net.messages)
    # Push-sum conserves its weight.
    assert abs(sum(n.state.omega for n in net.nodes.values()) - 8) < 1e-9
