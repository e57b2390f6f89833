"""``fedcore plot`` options: --label, --title, --log-bytes, --bands, sweep folders, legends.

The run folders here are written by hand (config.toml, metrics.jsonl, summary.json), so
the tests draw without running anything.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib.figure
import pytest

from fedcore.config import config_to_dict, dumps_toml, load_config
from fedcore.plotting import (
    LEGEND_OUTSIDE,
    RunRecords,
    curve_style,
    default_labels,
    expand_runs,
    plot_runs,
    run_engine,
    seed_groups,
    strip_seed,
)
from fedcore.plotting.curves import _mean_curve
from tests.clitools import cli, one_line_error

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_run(
    folder: Path,
    *,
    seed: int = 0,
    overrides: Sequence[str] = (),
    rounds: Sequence[int] = (1, 3, 5),
    bytes_per_round: float = 1000.0,
    regret: bool = False,
    config: bool = True,
    every_round: bool = False,
    summary: dict[str, Any] | None = None,
) -> Path:
    """A finished run's folder: evaluations at ``rounds`` whose figures depend on
    ``seed``; the first evaluation at 0 bytes when ``bytes_per_round`` is 0 at round 1.
    With ``every_round``, a ``"kind": "round"`` record for every round up to the last
    evaluation (16 peers' bytes, the same loss as the evaluations') and two node
    records a round. ``summary``: more keys of ``summary.json`` (its engine, say)."""
    folder.mkdir(parents=True)
    items = [*overrides, f"run.seed={seed}"]
    if config:
        text = dumps_toml(config_to_dict(load_config(None, items)))
        (folder / "config.toml").write_text(text, encoding="utf-8")
    lines: list[dict[str, Any]] = []
    for t in range(max(rounds) + 1) if every_round else ():
        for node in ("n0", "n1"):
            lines.append({"node": node, "round": t, "loss": 9.0, "kind": "node"})
        lines.append(
            {
                "kind": "round",
                "round": t,
                "train_loss": 1.0 / (t + 1) + 0.01 * seed,
                "nodes_up": 16,
                "bytes_sent": 16 * bytes_per_round if t else 0,
            }
        )
    for t in rounds:
        lines.append(
            {
                "kind": "eval",
                "round": t,
                "train_loss": 1.0 / (t + 1) + 0.01 * seed,
                "average_loss": 1.0,
                "bytes_sent_per_node": bytes_per_round * t,
                "avg_model_accuracy": 0.5 + 0.05 * t + 0.01 * seed,
                "mean_node_accuracy": 0.4 + 0.05 * t,
                "consensus_distance": None,  # strict JSON: null where not a number
            }
        )
        if regret:
            lines.append(
                {
                    "kind": "regret",
                    "round": t,
                    "average_static_regret": 1.0 / (t + 1),
                    "average_dynamic_regret": None,
                }
            )
    text = "".join(json.dumps(line) + "\n" for line in lines)
    (folder / "metrics.jsonl").write_text(text, encoding="utf-8")
    name = "-".join(["ops-social-16", *items])
    record = {"name": name, **(summary or {})}
    (folder / "summary.json").write_text(json.dumps(record), encoding="utf-8")
    return folder


def fake_sweep(folder: Path, seeds: Sequence[int], **kwargs: Any) -> Path:
    runs = [fake_run(folder / f"seed-{k}", seed=k, **kwargs) for k in seeds]
    record = {
        "kind": "sweep",
        "seeds": list(seeds),
        "runs": [
            {"seed": k, "out_dir": r.name, "status": "completed"}
            for k, r in zip(seeds, runs, strict=True)
        ]
        + [{"seed": 99, "out_dir": "seed-99", "status": "failed", "reason": "diverged"}],
    }
    (folder / "sweep.json").write_text(json.dumps(record), encoding="utf-8")
    return folder


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[matplotlib.figure.Figure]:
    """Every figure ``plot_runs`` saves, kept for inspection."""
    saved: list[matplotlib.figure.Figure] = []
    original = matplotlib.figure.Figure.savefig

    def keep(self: matplotlib.figure.Figure, *args: Any, **kwargs: Any) -> None:
        saved.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return saved


# --- the CLI options --------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        ["--label", "compression.codec"],
        ["--label", "algorithm.lr"],
        ["--title", "two codecs"],
        ["--log-bytes"],
        ["--bands"],
        ["--bands", "--label", "compression.codec", "--log-bytes", "--title", "t"],
    ],
)
def test_each_plot_option_writes_the_picture(
    options: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = fake_sweep(tmp_path / "fp32", [0, 1, 2])
    b = fake_run(tmp_path / "sign", overrides=["compression.codec=sign", "algorithm.lr=0.1"])
    png = tmp_path / "p.png"
    status, out, err = cli(capsys, "plot", str(a), str(b), "--out", str(png), *options)
    assert status == 0, err
    assert str(png) in out
    assert png.read_bytes().startswith(PNG_MAGIC)


def test_label_names_each_curve_by_the_config_key(
    tmp_path: Path, figures: list[matplotlib.figure.Figure]
) -> None:
    a = fake_run(tmp_path / "a")
    b = fake_run(tmp_path / "b", overrides=["compression.codec=sign"])
    c = fake_run(tmp_path / "c", overrides=["algorithm.lr=0.25"])
    plot_runs([a, b], tmp_path / "p.png", label="compression.codec", title="codecs")
    plot_runs([a, c], tmp_path / "q.png", label="algorithm.lr")
    first, second = figures
    assert [line.get_label() for line in first.axes[0].get_lines()] == ["fp32", "sign"]
    assert first.get_suptitle() == "codecs"
    assert [line.get_label() for line in second.axes[0].get_lines()] == [
        "algorithm.lr=0.5",
        "algorithm.lr=0.25",
    ]


def test_label_of_a_missing_key_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = fake_run(tmp_path / "r")
    argv = ["plot", str(run), "--out", str(tmp_path / "p.png"), "--label", "algorithm.nope"]
    one_line_error(capsys, argv, "algorithm.nope", str(run))
    assert not (tmp_path / "p.png").exists()


def test_label_of_a_run_without_config_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = fake_run(tmp_path / "r", config=False)
    argv = ["plot", str(run), "--out", str(tmp_path / "p.png"), "--label", "algorithm.name"]
    one_line_error(capsys, argv, "no config.toml", str(run), "--label")
    one_line_error(capsys, [*argv[:4], "--bands"], "no config.toml", "--bands")


def test_log_bytes_leaves_out_points_at_zero_bytes(
    tmp_path: Path, figures: list[matplotlib.figure.Figure]
) -> None:
    sends = fake_run(tmp_path / "sends", rounds=(0, 2, 4))  # 0 bytes at round 0
    silent = fake_run(tmp_path / "silent", seed=1, bytes_per_round=0.0)  # never sends
    plot_runs([sends, silent], tmp_path / "p.png", log_bytes=True)
    (fig,) = figures
    by_bytes = fig.axes[2]
    assert by_bytes.get_xscale() == "log"
    sizes = [len(line.get_xdata()) for line in by_bytes.get_lines()]
    assert sizes == [2, 0]
    assert fig.axes[0].get_xscale() == "linear"  # the rounds axis keeps its scale
    plot_runs([silent], tmp_path / "q.png", log_bytes=True)  # nothing to log-scale
    assert figures[1].axes[2].get_xscale() == "linear"


def test_six_curves_put_the_legend_below_the_panels(
    tmp_path: Path, figures: list[matplotlib.figure.Figure]
) -> None:
    runs = [fake_run(tmp_path / f"r{k}", seed=k) for k in range(LEGEND_OUTSIDE)]
    plot_runs(runs[:2], tmp_path / "few.png")
    plot_runs(runs, tmp_path / "many.png")
    few, many = figures
    assert few.axes[1].get_legend() is not None
    assert not few.legends
    assert all(ax.get_legend() is None for ax in many.axes)
    (legend,) = many.legends
    assert len(legend.get_texts()) == LEGEND_OUTSIDE + 1  # and the dashed-line key


def test_a_png_is_drawn_once_with_the_legend_below_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    draws: list[matplotlib.figure.Figure] = []
    original = matplotlib.figure.Figure.draw

    def count(self: matplotlib.figure.Figure, renderer: Any) -> None:
        draws.append(self)
        original(self, renderer)

    monkeypatch.setattr(matplotlib.figure.Figure, "draw", count)
    runs = [fake_run(tmp_path / f"r{k}", seed=k) for k in range(LEGEND_OUTSIDE)]
    few = plot_runs(runs[:2], tmp_path / "few.png")
    many = plot_runs(runs, tmp_path / "many.png")
    assert len(draws) == 2  # no unseen draw first, to lay the figure out or to measure it
    from PIL import Image

    with Image.open(few) as small, Image.open(many) as tall:  # the legend is in the picture
        assert tall.height > small.height + 40


def test_regret_panels_get_bands_too(
    tmp_path: Path, figures: list[matplotlib.figure.Figure]
) -> None:
    sweep = fake_sweep(tmp_path / "sw", [0, 1], regret=True)
    plot_runs([sweep], tmp_path / "p.png", bands=True)
    (fig,) = figures
    assert len(fig.axes) == 6
    assert [line.get_label() for line in fig.axes[4].get_lines()] == [
        "ops-social-16 (mean ± std, 2 seeds)"
    ]


# --- what the default picture shows ------------------------------------------------------


def test_the_training_loss_is_drawn_for_every_round(
    tmp_path: Path, figures: list[matplotlib.figure.Figure]
) -> None:
    run = fake_run(tmp_path / "r", rounds=(4, 9), every_round=True)
    old = fake_run(tmp_path / "old", seed=1, rounds=(4, 9))  # no round records: evaluations
    sweep = fake_sweep(tmp_path / "sw", [0, 1], rounds=(4, 9), every_round=True)
    plot_runs([run, old], tmp_path / "p.png")
    plot_runs([sweep], tmp_path / "q.png", bands=True)
    fig, banded = figures
    by_round, by_bytes = fig.axes[0].get_lines(), fig.axes[2].get_lines()
    assert list(by_round[0].get_xdata()) == list(range(1, 11))  # 10 rounds, 10 points
    assert list(by_round[0].get_ydata()) == pytest.approx([1.0 / t for t in range(1, 11)])
    # Each node's bytes by then (16 peers' bytes over 16): the evaluations' figure at theirs.
    assert list(by_bytes[0].get_xdata()) == pytest.approx([1e-3 * t for t in range(10)])
    assert list(by_round[1].get_xdata()) == [5, 10]
    (mean,) = banded.axes[0].get_lines()
    assert len(mean.get_xdata()) == 10
    assert list(mean.get_ydata()) == pytest.approx([1.0 / t + 0.005 for t in range(1, 11)])
    assert len(fig.axes[1].get_lines()[0].get_xdata()) == 2  # accuracy: evaluations only


def test_the_default_title_names_config_algorithm_and_graph(
    tmp_path: Path, figures: list[matplotlib.figure.Figure]
) -> None:
    one = fake_run(tmp_path / "one", overrides=["run.name=mine"])
    two = fake_run(tmp_path / "two", overrides=["run.name=mine", "algorithm.name=dpsgd"])
    ring = fake_run(tmp_path / "ring", overrides=["topology.kind=ring"])
    plot_runs([one], tmp_path / "a.png")
    plot_runs([one, two, ring], tmp_path / "b.png")
    plot_runs([one], tmp_path / "c.png", title="mine")
    assert [fig.get_suptitle() for fig in figures] == [
        "mine: ops on social-16",
        "mine: ops, dpsgd on social-16, ring-16",
        "mine",
    ]
    # The graph's own name where the summary has it.
    (one / "summary.json").write_text(
        json.dumps({"name": "x", "algorithm": "ops", "topology": {"name": "social-16-s0"}}),
        encoding="utf-8",
    )
    plot_runs([one], tmp_path / "d.png")
    assert figures[-1].get_suptitle() == "mine: ops on social-16-s0"


@pytest.mark.parametrize(
    ("bytes_per_round", "log_bytes", "scale"),
    [
        (11_000.0, None, "log"),  # 11x: log by itself
        (9_000.0, None, "linear"),  # 9x: linear
        (9_000.0, True, "log"),  # --log-bytes forces it
        (11_000.0, False, "linear"),
    ],
)
def test_the_bytes_axes_go_log_when_the_runs_bytes_differ_over_10x(
    bytes_per_round: float,
    log_bytes: bool | None,
    scale: str,
    tmp_path: Path,
    figures: list[matplotlib.figure.Figure],
) -> None:
    small = fake_run(tmp_path / "small", every_round=True)
    big = fake_run(tmp_path / "big", seed=1, bytes_per_round=bytes_per_round, every_round=True)
    silent = fake_run(tmp_path / "silent", seed=2, bytes_per_round=0.0)  # sends nothing
    plot_runs([small, big, silent], tmp_path / "p.png", log_bytes=log_bytes)
    (fig,) = figures
    assert [fig.axes[k].get_xscale() for k in (2, 3)] == [scale, scale]
    assert [fig.axes[k].get_xscale() for k in (0, 1)] == ["linear", "linear"]
    assert fig.axes[2].get_xlabel().endswith("(log)") == (scale == "log")


def test_the_cli_logs_the_bytes_axes_by_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], figures: list[matplotlib.figure.Figure]
) -> None:
    small = fake_run(tmp_path / "small")
    big = fake_run(tmp_path / "big", seed=1, bytes_per_round=20_000.0)
    status, _, err = cli(capsys, "plot", str(small), str(big), "--out", str(tmp_path / "p.png"))
    assert status == 0, err
    assert figures[0].axes[2].get_xscale() == "log"


def loss_labels(fig: matplotlib.figure.Figure) -> list[str]:
    return [str(line.get_label()) for line in fig.axes[0].get_lines()]


def test_labels_show_the_codec_where_the_runs_differ_in_it(
    tmp_path: Path, figures: list[matplotlib.figure.Figure]
) -> None:
    fp32 = fake_run(tmp_path / "fp32")
    sign = fake_run(tmp_path / "sign", overrides=["compression.codec=sign"])
    dpsgd = fake_run(tmp_path / "dpsgd", overrides=["algorithm.name=dpsgd"])
    plot_runs([fp32, sign], tmp_path / "a.png")
    plot_runs([fp32, sign, dpsgd], tmp_path / "b.png")
    plot_runs([fp32, sign], tmp_path / "c.png", label="algorithm.name")  # --label overrides
    sweeps = [
        fake_sweep(tmp_path / "sw-fp32", [0, 1]),
        fake_sweep(tmp_path / "sw-sign", [0, 1], overrides=["compression.codec=sign"]),
    ]
    plot_runs(sweeps, tmp_path / "d.png", bands=True)
    assert [loss_labels(fig) for fig in figures] == [
        ["fp32", "sign"],
        ["ops, fp32", "ops, sign", "dpsgd, fp32"],
        ["ops", "ops"],
        ["fp32 (mean ± std, 2 seeds)", "sign (mean ± std, 2 seeds)"],
    ]


def test_labels_show_what_differs_between_the_runs(
    tmp_path: Path, figures: list[matplotlib.figure.Figure]
) -> None:
    base = fake_run(tmp_path / "base")
    ring = fake_run(tmp_path / "ring", overrides=["topology.kind=ring", "topology.nodes=8"])
    lr = fake_run(tmp_path / "lr", overrides=["algorithm.lr=0.1"])
    seed = fake_run(tmp_path / "seed", seed=1)
    plot_runs([base, ring, lr], tmp_path / "a.png")
    plot_runs([base, lr], tmp_path / "b.png")
    plot_runs([base, seed], tmp_path / "c.png")
    plot_runs([base, base], tmp_path / "d.png")  # nothing differs: the runs' names
    assert [loss_labels(fig) for fig in figures] == [
        # the value most runs share is left out of the key=value parts
        ["social-16", "ring-8", "social-16, algorithm.lr=0.1"],
        ["algorithm.lr=0.5", "algorithm.lr=0.1"],
        ["run.seed=0", "run.seed=1"],
        ["ops-social-16-run.seed=0", "ops-social-16-run.seed=0"],
    ]


MESSAGES = {"transport": "inproc", "engine": "messages"}
VECTORIZED = {"transport": "inproc", "engine": "vectorized"}
LAUNCHED = {"transport": "grpc", "engine": "peers", "peers_per_process": 1}  # launch's
"""The ``summary.json`` keys that say what ran a run."""


def test_runs_of_one_config_on_different_engines_are_told_apart(
    tmp_path: Path, figures: list[matplotlib.figure.Figure]
) -> None:
    """The same config on the message engine, the vectorized engine and over gRPC: the
    config.toml files are the same, so without the engine the three labels were one."""
    messages = fake_run(tmp_path / "m", summary=MESSAGES)
    vectorized = fake_run(tmp_path / "v", summary=VECTORIZED)
    launched = fake_run(tmp_path / "g", summary=LAUNCHED)
    sign = fake_run(tmp_path / "s", overrides=["compression.codec=sign"], summary=MESSAGES)
    # The config says which engine: the engine that ran stands for simulate.engine.
    chosen = fake_run(tmp_path / "c", overrides=["simulate.engine=vectorized"], summary=VECTORIZED)
    plot_runs([messages, vectorized, launched], tmp_path / "a.png")
    plot_runs([messages, launched], tmp_path / "b.png", label="algorithm.name")
    plot_runs([messages, sign, vectorized], tmp_path / "c.png")
    plot_runs([messages, chosen], tmp_path / "d.png")
    plot_runs([messages, sign], tmp_path / "e.png")  # one engine: not named
    assert [loss_labels(fig) for fig in figures] == [
        ["messages", "vectorized", "grpc peers"],
        ["ops, messages", "ops, grpc peers"],
        ["fp32, messages", "sign, messages", "fp32, vectorized"],
        ["messages", "vectorized"],
        ["fp32", "sign"],
    ]
    for fig in figures:  # every panel's legend says the same
        labels = loss_labels(fig)
        assert len(set(labels)) == len(labels), labels


def test_bands_keep_the_engines_apart(
    tmp_path: Path, figures: list[matplotlib.figure.Figure]
) -> None:
    simulated = fake_sweep(tmp_path / "sim", [0, 1], summary=MESSAGES)
    launched = fake_sweep(tmp_path / "launch", [0, 1], summary=LAUNCHED)
    plot_runs([simulated, launched], tmp_path / "p.png", bands=True)
    (fig,) = figures
    assert loss_labels(fig) == [
        "messages (mean ± std, 2 seeds)",
        "grpc peers (mean ± std, 2 seeds)",
    ]


def test_run_engine_reads_what_ran_the_run() -> None:
    assert run_engine(MESSAGES) == "messages"
    assert run_engine(VECTORIZED) == "vectorized"
    assert run_engine({"transport": "inproc", "engine": "events"}) == "events"
    assert run_engine(LAUNCHED) == "grpc peers"
    assert run_engine({"transport": "inproc"}) == "messages"  # before the engine was kept
    assert run_engine({}) == ""
    assert run_engine({"engine": ["not", "a", "name"]}) == ""
    long = run_engine({"engine": "x\n" * 100})  # a file's text: one short line
    assert "\n" not in long and len(long) < 80


def test_default_labels_leave_out_an_algorithms_own_keys() -> None:
    def config(algorithm: str, **keys: Any) -> dict[str, Any]:
        return {"run": {"name": algorithm}, "algorithm": {"name": algorithm, **keys}}

    configs = [config("choco", gamma=0.5, lr=0.5), config("dpsgd", lr=0.5)]
    assert default_labels(configs, ["g", "g"], ["a", "b"]) == ["choco", "dpsgd"]
    assert default_labels([configs[0], None], ["g", "g"], ["a", "b"]) == ["a", "b"]


def test_eight_runs_stay_readable(tmp_path: Path, figures: list[matplotlib.figure.Figure]) -> None:
    runs = [fake_run(tmp_path / f"r{k}", overrides=[f"algorithm.lr={k / 10}"]) for k in range(8)]
    plot_runs(runs, tmp_path / "p.png")
    (fig,) = figures
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends  # below the panels, off the curves
    assert legend._ncols >= 2
    assert len(legend.get_texts()) == 9
    lines = fig.axes[0].get_lines()
    looks = {(line.get_color(), line.get_linestyle(), line.get_marker()) for line in lines}
    assert len(looks) == len({line.get_color() for line in lines}) == 8
    styles = [curve_style(i) for i in range(40)]  # past ten colours: the next line style
    assert len({tuple(sorted(style.items())) for style in styles}) == 40
    assert all(style["linestyle"] != "--" for style in styles)  # the mean node's


# --- sweep folders and groups -----------------------------------------------------------


def test_a_sweep_folder_stands_for_its_completed_runs(tmp_path: Path) -> None:
    sweep = fake_sweep(tmp_path / "sw", [0, 2])
    other = fake_run(tmp_path / "other")
    assert expand_runs([sweep, other]) == [sweep / "seed-0", sweep / "seed-2", other]


def test_a_folder_that_does_not_exist_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "runs" / "nonexistent"
    out = tmp_path / "p.png"
    line = one_line_error(capsys, ["plot", str(missing), "--out", str(out)], str(missing))
    assert "does not exist" in line and "metrics.jsonl" not in line.split(";")[0], line
    afile = tmp_path / "notes.txt"
    afile.write_text("x", encoding="utf-8")
    one_line_error(capsys, ["plot", str(afile), "--out", str(out)], "is a file")
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(capsys, ["plot", str(empty), "--out", str(out)], "has no metrics.jsonl")
    assert not out.exists()


def test_a_sweep_without_completed_runs_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = tmp_path / "sw"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps({"runs": []}), encoding="utf-8")
    one_line_error(
        capsys, ["plot", str(sweep), "--out", str(tmp_path / "p.png")], "no completed run"
    )
    (sweep / "sweep.json").write_text("{", encoding="utf-8")
    one_line_error(capsys, ["plot", str(sweep), "--out", str(tmp_path / "p.png")], "sweep file")


def test_seed_groups_ignore_only_the_seed_and_the_name() -> None:
    def config(seed: int, name: str = "", lr: float = 0.5) -> dict[str, Any]:
        return {"run": {"seed": seed, "name": name, "rounds": 3}, "algorithm": {"lr": lr}}

    configs = [
        config(0),
        config(1, name="x-seed1"),
        config(0, lr=0.1),
        config(2),
        config(1, lr=0.1),
        {"run": {"seed": 0, "name": "", "rounds": 4}, "algorithm": {"lr": 0.5}},
    ]
    assert seed_groups(configs) == [[0, 1, 3], [2, 4], [5]]


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("ops-ring-16-run.seed=3", "ops-ring-16"),
        ("ops-ring-16-seed3", "ops-ring-16"),
        ("ops-ring-16-algorithm.lr=0.1-run.seed=12", "ops-ring-16-algorithm.lr=0.1"),
        ("ops-ring-16-seeds0-4", "ops-ring-16-seeds0-4"),  # a sweep's name keeps its seeds
        # Another table's seed tells groups apart: only run.seed goes.
        ("ops-social-16-topology.seed=1-run.seed=3", "ops-social-16-topology.seed=1"),
        ("ops-ring-16-data.seed=2", "ops-ring-16-data.seed=2"),
    ],
)
def test_strip_seed(name: str, base: str) -> None:
    assert strip_seed(name) == base


def test_bands_are_the_mean_and_sample_std_at_the_common_rounds() -> None:
    def evals(rounds: Sequence[int], acc: float) -> list[dict[str, Any]]:
        return [
            {
                "round": t,
                "train_loss": 1.0,
                "avg_model_accuracy": acc + t,
                "mean_node_accuracy": None,
                "bytes_sent_per_node": 10.0 * t,
            }
            for t in rounds
        ]

    def run(evals: list[dict[str, Any]]) -> RunRecords:
        return RunRecords(Path("r"), "r", evals, [], [], {})

    curve = _mean_curve(
        "g",
        [
            run(evals([1, 3, 5], 0.1)),
            run(evals([1, 3], 0.2)),  # stopped early: round 5 is not common
            run(evals([1, 3, 5], 0.6)),
        ],
    )
    assert curve.rounds == [2, 4]
    assert curve.series["avg_model_accuracy"] == pytest.approx([1.3, 3.3])
    assert curve.spread is not None
    assert curve.spread["avg_model_accuracy"] == pytest.approx([0.2645751311, 0.2645751311])
    assert curve.spread["train_loss"] == [0.0, 0.0]
    assert curve.series["bytes_sent_per_node"] == pytest.approx([10.0, 30.0])


def test_a_recycled_figure_draws_the_picture_a_new_one_draws(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``recycling``: a picture drawn on the figure the one before left (another run's
    curves, axes limits and regret panel; one legend in a panel, the other below the
    panels) is the picture a new figure draws, byte for byte."""
    from fedcore.plotting import figure

    monkeypatch.setattr(figure, "_spares", {})  # the first picture on a new figure
    a = fake_run(tmp_path / "a", every_round=True, regret=True, rounds=(1, 3, 5, 40))
    b = fake_run(tmp_path / "b", seed=7, regret=True, overrides=["algorithm.lr=0.123456789"])
    with figure.recycling():
        drawn = [plot_runs([run], tmp_path / "kept.png").read_bytes() for run in (a, b, a)]
    assert figure._spares  # kept for the next
    assert drawn[2] == drawn[0]
    assert drawn[1] == plot_runs([b], tmp_path / "new.png").read_bytes()
    assert drawn[1] != drawn[0]
