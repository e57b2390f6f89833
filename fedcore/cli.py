"""The ``fedcore`` command line: the only place that configures logging.

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

import argparse
import gc
import json
import logging
import math
import os
import signal
import sys
import tomllib
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedcore import __version__
from fedcore.errors import ConfigError, FedcoreError
from fedcore.ids import check_node_id, child_path, clip, first_line

if TYPE_CHECKING:
    from fedcore.config import Config

__all__ = ["main"]

EXIT_USAGE = 2
EXIT_RUNTIME = 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedcore",
        description="Decentralized learning over directed trust graphs.",
    )
    parser.add_argument("--version", action="version", version=f"fedcore {__version__}")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more logging: -v fedcore's steps and the traceback behind an error, -vv "
        "fedcore's debug lines, -vvv every library's",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim = sub.add_parser(
        "simulate",
        help="run every peer in this process",
        description="Run every peer of CONFIG in this process (default: the built-in run, "
        "OPS on a 16-node directed social trust graph with digits).",
    )
    lau = sub.add_parser(
        "launch",
        help="run every peer as its own process over gRPC on 127.0.0.1",
        description="Start one `fedcore node` process per peer of CONFIG on this machine "
        "(or one per K peers, --peers-per-process), supervise them, and write the same "
        "results folder as `simulate`.",
    )
    lau.add_argument(
        "--peers-per-process",
        type=int,
        default=1,
        metavar="K",
        help="peers each process hosts (default 1): ceil(N/K) processes, each one torch "
        "(about 350 MB) and one event loop, every peer still its own gRPC server, port and "
        "nodes/<id>/ folder; the same results. Process logs go to procs/<i>.log",
    )
    sim.add_argument(
        "--engine",
        choices=("auto", "vectorized", "messages"),
        help="simulate.engine: 'vectorized' (every node's round at once), 'messages' (one "
        "node object per peer, exchanging encoded messages) or 'auto' (vectorized where "
        "it supports the config; the default)",
    )
    sim.add_argument(
        "--device", metavar="DEV", help="simulate.device: cpu (default), cuda or cuda:K"
    )
    sim.add_argument(
        "--seeds",
        metavar="SEEDS",
        help="a seed sweep: run the config once per seed (e.g. 0-4 or 0,3,7), one folder "
        "each, and a table and results.csv of mean +- std of the final figures",
    )
    sim.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="with --seeds: runs in parallel worker processes (default 1)",
    )
    sim.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the interrupted run in RUN_DIR from its last checkpoint "
        "(run.checkpoint_every); it ends as the uninterrupted run would",
    )
    for p in (sim, lau):
        p.add_argument("config", nargs="?", help="experiment TOML (default: built-in)")
        p.add_argument("--out", help="results folder (default: runs/<name>-<timestamp>)")
        p.add_argument(
            "--name",
            help="the run's name (run.name; default: algorithm-topology, plus what --set changed)",
        )
        p.add_argument(
            "--force", action="store_true", help="replace the run an existing --out folder holds"
        )
        _set_option(p)
        p.add_argument(
            "-q",
            "--quiet",
            action="store_true",
            help="no progress or table; print only where the results are",
        )
        _threads_option(p)

    node = sub.add_parser(
        "node",
        help="run one peer (or several in one process) over gRPC",
        description="Run a peer of a run: serve its in-neighbours, connect to its "
        "out-neighbours as the roster says, and train. The roster maps node ids to "
        "HOST:PORT (JSON object, or TOML [peers] table). With --id a,b,c the process hosts "
        "several peers (one torch, one event loop), each its own server on its roster "
        "address with its own folder: the same run as one process a peer.",
    )
    node.add_argument("--config", required=True, help="experiment TOML (every peer the same)")
    node.add_argument(
        "--id",
        required=True,
        dest="node_id",
        metavar="ID[,ID...]",
        help="this peer's node id, or several, comma-separated, for one process to host",
    )
    node.add_argument("--roster", required=True, help="node id -> HOST:PORT file")
    node.add_argument(
        "--listen",
        metavar="HOST:PORT[,...]",
        help="HOST:PORT to serve on (default: the roster's entry); with several ids, one per "
        "id in the same order",
    )
    node.add_argument(
        "--out",
        help="this peer's folder (default: runs/node-<id>); with several ids, the folder "
        "that holds one <id>/ per peer; '{id}' in it stands for each peer's id",
    )
    node.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest good checkpoint in <out>/checkpoints (run.checkpoint_every)",
    )
    _set_option(node)
    _threads_option(node)
    node.add_argument(
        "-q", "--quiet", action="store_true", help="no start-up, progress or results lines"
    )

    comp = sub.add_parser(
        "compose",
        help="write a docker-compose deployment: one container per peer",
        description="Write DIR/docker-compose.yml (one service per node; service name = "
        "hostname = node id), DIR/config.toml, DIR/roster.json and DIR/nodes/<id>/ (each "
        "peer's bind-mounted output folder, which `fedcore summarize DIR` reads afterwards), "
        "plus DIR/certs/ when [transport.tls] is set. Multi-host: --roster gives every "
        "peer's HOST:PORT and --nodes the peers of this host, which publish their ports. "
        "With --swarm: DIR/docker-stack.yml for `docker stack deploy` instead (an encrypted "
        "overlay network, certificates as secrets, config and roster as configs, a volume "
        "per peer, DIR/gather.sh to collect the results).",
    )
    comp.add_argument("config", nargs="?", help="experiment TOML (default: built-in)")
    comp.add_argument("--out", required=True, metavar="DIR", help="folder to write")
    _set_option(comp)
    comp.add_argument(
        "--image", default="fedcore:latest", metavar="NAME", help="default fedcore:latest"
    )
    comp.add_argument(
        "--port", type=int, default=7000, metavar="N", help="each peer's port (default 7000)"
    )
    comp.add_argument(
        "--nodes", metavar="ID,ID", help="multi-host: this host's node ids (needs --roster)"
    )
    comp.add_argument(
        "--roster", metavar="FILE", help="multi-host: every peer's HOST:PORT (JSON or TOML)"
    )
    comp.add_argument(
        "--swarm", action="store_true", help="write a Docker Swarm stack (docker-stack.yml)"
    )
    comp.add_argument(
        "--place",
        metavar="ID=HOST[,...]",
        help="--swarm: pin peers to the swarm hosts labelled fedcore.host=HOST",
    )
    comp.add_argument(
        "-q", "--quiet", action="store_true", help="print only the compose file written"
    )

    kube = sub.add_parser(
        "k8s",
        help="write Kubernetes manifests: one StatefulSet per peer",
        description="Write DIR/k8s/ (a headless Service, a ConfigMap with the config and "
        "roster, one Secret per node with its certificate and key when [transport.tls] is "
        "set, one StatefulSet per node whose pod <id>-0 has its own volume claim for "
        "/fedcore/out), DIR/kustomization.yaml, DIR/gather.sh (copies each pod's results to "
        "DIR/nodes/<id>/ and runs `fedcore summarize DIR`) and DIR/config.toml. Quantities "
        "are Kubernetes', e.g. 500m, 2, 512Mi, 4Gi.",
    )
    kube.add_argument("config", nargs="?", help="experiment TOML (default: built-in)")
    kube.add_argument("--out", required=True, metavar="DIR", help="folder to write")
    _set_option(kube)
    kube.add_argument(
        "--image", default="fedcore:latest", metavar="NAME", help="default fedcore:latest"
    )
    kube.add_argument(
        "--port", type=int, default=7000, metavar="N", help="each peer's port (default 7000)"
    )
    kube.add_argument(
        "--namespace", default="default", metavar="NS", help="of every object (default default)"
    )
    kube.add_argument(
        "--name",
        default="fedcore",
        metavar="NAME",
        help="the headless Service; prefix of the ConfigMap and Secrets (default fedcore)",
    )
    kube.add_argument(
        "--cluster-domain",
        default="cluster.local",
        metavar="DOMAIN",
        help="the cluster's DNS domain, in the roster (default cluster.local)",
    )
    kube.add_argument("--cpu", default="1", metavar="Q", help="CPU request a peer (default 1)")
    kube.add_argument("--memory", default="1Gi", metavar="Q", help="memory request (default 1Gi)")
    kube.add_argument("--cpu-limit", metavar="Q", help="CPU limit (default: none)")
    kube.add_argument(
        "--memory-limit", default="2Gi", metavar="Q", help="memory limit (default 2Gi; none: 0)"
    )
    kube.add_argument(
        "--storage", default="1Gi", metavar="Q", help="each peer's volume claim (default 1Gi)"
    )
    kube.add_argument(
        "--storage-class", metavar="NAME", help="the claims' storage class (default: cluster's)"
    )
    kube.add_argument("-q", "--quiet", action="store_true", help="print only the folder written")

    summ = sub.add_parser(
        "summarize",
        help="merge the peer folders of a run that ran elsewhere into its results",
        description="Read RUN_DIR/nodes/<id>/ (each peer's --out folder: compose volumes, "
        "or folders copied from several hosts) and write the same metrics.jsonl, "
        "summary.json and curves.png as `launch`. A peer that did not finish counts as "
        "down from its last record.",
    )
    summ.add_argument("run_dir", metavar="RUN_DIR")
    summ.add_argument("--config", help="experiment TOML (default: RUN_DIR/config.toml)")
    summ.add_argument("-q", "--quiet", action="store_true", help="no table")

    certs = sub.add_parser("certs", help="certificates for mutual TLS between peers")
    certs_sub = certs.add_subparsers(dest="certs_command", required=True, metavar="ACTION")
    init = certs_sub.add_parser(
        "init",
        help="make a CA and one key and certificate per node",
        description="Write DIR/ca.crt, DIR/ca.key and, per node, DIR/<id>.crt (the node id as "
        "its subject alternative name) and DIR/<id>.key. A DIR that has a CA keeps it, and "
        "only nodes without a good certificate (none, expired, or not this CA's) get one. "
        "Point [transport.tls] dir at DIR; give each host ca.crt and only its own nodes' "
        "files, never ca.key.",
    )
    init.add_argument("--nodes", nargs="+", metavar="ID", help="node ids")
    init.add_argument("--config", help="take the node ids from this experiment's graph")
    init.add_argument("--out", required=True, help="certificate folder")
    init.add_argument("--days", type=int, default=365, help="validity (default 365)")
    init.add_argument(
        "--force",
        action="store_true",
        help="a new CA, and every certificate in DIR issued anew",
    )
    init.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")

    hea = sub.add_parser(
        "health",
        help="check that a peer is serving (exit 0) through its gRPC health service",
        description="Ask the peer at HOST:PORT whether it serves. With a config whose "
        "[transport.tls] is set, it connects with the certificate of --id and expects the "
        "peer to present that node's certificate (for a container's own health check).",
    )
    hea.add_argument("address", metavar="HOST:PORT")
    hea.add_argument("--config", help="experiment TOML (for [transport.tls])")
    hea.add_argument("--id", dest="node_id", help="node id (needed with TLS)")
    hea.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")

    topo = sub.add_parser("topology", help="inspect trust graphs")
    topo_sub = topo.add_subparsers(dest="topology_command", required=True, metavar="ACTION")
    show = topo_sub.add_parser(
        "show",
        help="print nodes, edges, connectivity, degrees, spectral gap",
        description="SPEC is KIND:NODES[:key=value,...] (e.g. ring:8, torus:4x4, social:32, "
        "erdos-renyi:20:p=0.2,seed=1) or a graph file (.json, .graphml, .edgelist).",
    )
    show.add_argument("spec", metavar="SPEC|FILE")

    plot = sub.add_parser("plot", help="plot loss and accuracy of runs")
    plot.add_argument("runs", nargs="+", metavar="RUN_DIR")
    plot.add_argument("--out", required=True, help="picture to write: .png, .pdf or .svg")
    plot.add_argument(
        "--label",
        metavar="KEY",
        help="label each curve by this config key of its run (e.g. algorithm.name) "
        "instead of the run's name",
    )
    plot.add_argument("--title", help="the figure's title")
    plot.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    plot.add_argument("--log-bytes", action="store_true", help="a log scale on the bytes-sent axis")
    plot.add_argument(
        "--bands",
        action="store_true",
        help="one curve per group of runs that differ only in run.seed: the mean, with a "
        "band of +- one standard deviation",
    )
    for leaf in (sim, lau, node, comp, summ, init, hea, show, plot):
        leaf.add_argument(
            "-v",
            "--verbose",
            dest="sub_verbose",
            action="count",
            default=0,
            help="more logging: -v fedcore's steps and the traceback behind an error, -vv "
            "fedcore's debug lines, -vvv every library's",
        )
    return parser


def _print_table(summary: dict[str, Any]) -> None:
    # Figures that are not numbers (a diverged run) are null in summary.json.
    final = {k: math.nan if v is None else v for k, v in summary.get("final", {}).items()}
    traffic = summary.get("traffic", {})
    gap = summary["topology"]["spectral_gap"]
    rows = [
        ("algorithm", summary["algorithm"]),
        (
            "topology",
            f"{summary['topology']['name']} "
            + (f"(gap {gap:.3f})" if gap is not None else "(gap not computed: too many nodes)"),
        ),
        ("nodes x rounds", f"{summary['nodes']} x {summary['rounds']}"),
        *(
            [("status", f"{status} after round {summary.get('rounds_completed')}")]
            if (status := summary.get("status", "completed")) != "completed"
            else []
        ),
        ("avg-model accuracy", f"{final.get('avg_model_accuracy', float('nan')):.4f}"),
        ("mean node accuracy", f"{final.get('mean_node_accuracy', float('nan')):.4f}"),
        ("min node accuracy", f"{final.get('min_node_accuracy', float('nan')):.4f}"),
        ("consensus distance", f"{final.get('consensus_distance', float('nan')):.4g}"),
        ("average loss", f"{final.get('average_loss', float('nan')):.4f}"),
        *(
            (label, f"{final[key]:.4g} (average {final[f'average_{key}']:.4g})")
            for key, label in (
                ("static_regret", "static regret"),
                ("dynamic_regret", "dynamic regret"),
            )
            if isinstance(final.get(key), float) and math.isfinite(final[key])
        ),
        ("bytes / node / round", f"{traffic.get('bytes_per_node_per_round', 0):.0f}"),
        *(
            [("bytes / node / local step", f"{traffic['bytes_per_node_per_local_step']:.0f}")]
            if traffic.get("local_steps", 1) > 1
            else []
        ),
        (
            "messages missing",
            f"{traffic.get('messages_missing', 0)} (the fault plan lost "
            f"{traffic.get('messages_dropped', 0)} at their senders)",
        ),
        ("wall time", f"{summary['wall_seconds']:.1f} s"),
        ("engine", summary.get("engine", "messages")),
        ("results", summary.get("out_dir", "")),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")


def _set_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key by dotted path, e.g. --set algorithm.name=dpsgd",
    )


def _threads_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: many small models gain nothing from more)",
    )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _set_threads(threads: int) -> None:
    """``--threads``, and freed large blocks kept for reuse (:mod:`fedcore.runtime`): this
    process runs the rounds."""
    if threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {threads}.")
    import torch

    from fedcore.runtime import keep_freed_memory

    torch.set_num_threads(threads)
    keep_freed_memory()


def _simulate(args: argparse.Namespace) -> int:
    if args.resume is not None:
        given = [
            flag
            for flag, value in (
                ("CONFIG", args.config),
                ("--set", args.overrides),
                ("--out", args.out),
                ("--name", args.name),
                ("--seeds", args.seeds),
                ("--engine", args.engine),
                ("--device", args.device),
                ("--force", args.force),
                ("--jobs", args.jobs != 1),
            )
            if value
        ]
        if given:
            raise ConfigError(
                f"--resume continues the run in its folder as it was configured; drop "
                f"{', '.join(given)}."
            )
        _start_run(args.threads)
        from fedcore.simulation.simulate import resume

        summary: dict[str, Any] | None = resume(args.resume, show_progress=not args.quiet)
    elif args.jobs != 1 and args.seeds is None:
        raise ConfigError("--jobs runs the seeds of a sweep in parallel; give --seeds too.")
    else:
        summary = _simulate_new(args)
    if summary is None:  # a sweep, which printed its own table
        return 0
    if args.quiet:
        print(f"results: {summary['out_dir']}")
    else:
        _print_table(summary)
    return 0


def _start_run(threads: int) -> None:
    """What a process that runs rounds sets first: its torch threads, freed memory kept,
    and SIGTERM stopping a run as Ctrl-C does (its summary says so; it can be resumed)."""
    _set_threads(threads)
    signal.signal(signal.SIGTERM, _interrupt)


def _simulate_new(args: argparse.Namespace) -> dict[str, Any] | None:
    from fedcore.config import load_config

    overrides = list(args.overrides)
    if args.engine:
        overrides.append(f"simulate.engine={args.engine}")
    if args.device:
        overrides.append(f"simulate.device={args.device}")
    if args.name is not None:
        overrides.append(f"run.name={json.dumps(args.name)}")
    # The config first: a bad file or --set answers before torch is imported.
    config = load_config(args.config, overrides)
    if args.seeds is not None:
        from fedcore.simulation.sweep import parse_seeds

        seeds = parse_seeds(args.seeds)
        _start_run(args.threads)
        from fedcore.simulation.sweep import run_sweep, sweep_table

        result = run_sweep(
            args.config,
            overrides,
            seeds,
            jobs=args.jobs,
            out_dir=args.out,
            force=args.force,
            show_progress=not args.quiet,
            threads=args.threads,
        )
        print(f"results: {result['out_dir']}" if args.quiet else sweep_table(result))
        return None
    _start_run(args.threads)
    from fedcore.simulation.simulate import simulate

    return simulate(
        config,
        out_dir=args.out,
        show_progress=not args.quiet,
        force=args.force,
        overrides=overrides,
    )


def _launch(args: argparse.Namespace) -> int:
    from fedcore.config import load_config

    overrides = list(args.overrides)
    if args.name is not None:
        overrides.append(f"run.name={json.dumps(args.name)}")
    config = load_config(args.config, overrides)
    # SIGTERM to the launcher stops its peers too (as Ctrl-C does), rather than orphaning them.
    _start_run(args.threads)
    from fedcore.deploy.launch import launch

    summary = launch(
        config,
        out_dir=args.out,
        show_progress=not args.quiet,
        threads=args.threads,
        force=args.force,
        overrides=overrides,
        peers_per_process=args.peers_per_process,
    )
    if args.quiet:
        print(f"results: {summary['out_dir']}")
    else:
        _print_table(summary)
    return 0


def _node_ids(text: str) -> list[str]:
    """The ids of ``--id a,b,c``: each a safe name, none twice."""
    ids = [part.strip() for part in text.split(",")]
    for n in ids:
        if not n:
            raise ConfigError(f"--id {clip(text)} has an empty id; give ids separated by commas.")
        check_node_id(n, "--id", ConfigError)
    twice = sorted({n for n in ids if ids.count(n) > 1})
    if twice:
        raise ConfigError(f"--id names {', '.join(map(repr, twice))} more than once.")
    return ids


def _node_outs(out: str | None, ids: list[str]) -> dict[str, Path]:
    """Each peer's folder: ``--out`` with ``{id}`` replaced; else ``--out`` itself (one
    id) or ``--out/<id>`` (several); default ``runs/node-<id>``."""
    if out is None:
        return {n: child_path(Path("runs"), f"node-{n}", ConfigError) for n in ids}
    if "{id}" in out:
        return {n: Path(out.replace("{id}", n)) for n in ids}
    if len(ids) == 1:
        return {ids[0]: Path(out)}
    return {n: child_path(Path(out), n, ConfigError) for n in ids}


def _node_listen(listen: str | None, ids: list[str]) -> dict[str, str] | None:
    """``--listen``: one HOST:PORT for one id, one per id (comma-separated) for several."""
    if listen is None:
        return None
    if len(ids) == 1:
        return {ids[0]: listen}
    addresses = [a.strip() for a in listen.split(",")]
    if len(addresses) != len(ids) or not all(addresses):
        raise ConfigError(
            f"--listen {clip(listen)} gives {len(addresses)} address(es) for {len(ids)} ids; "
            "give one HOST:PORT per id, in the order of --id, or leave --listen out (each "
            "peer serves on its roster address)."
        )
    return dict(zip(ids, addresses, strict=True))


def _node(args: argparse.Namespace) -> int:
    from fedcore.config import load_config
    from fedcore.progress import write_stage

    ids = _node_ids(args.node_id)
    listen = _node_listen(args.listen, ids)
    outs = _node_outs(args.out, ids)
    for out in outs.values():  # before torch's import, the longest part of a start-up
        write_stage(out, "importing")
    try:
        _set_threads(args.threads)
        from fedcore.deploy.peer import run_peers_main, tune_malloc
        from fedcore.deploy.roster import load_roster

        tune_malloc()
        config = load_config(args.config, args.overrides)
        roster = load_roster(args.roster)
    except Exception:
        for out in outs.values():
            write_stage(out, "failed")
        raise
    status = run_peers_main(
        config,
        ids,
        roster,
        outs=outs,
        listen=listen,
        resume=args.resume,
        show_progress=not args.quiet,
    )
    # Everything is written and closed. Spare the exit a final garbage collection of every
    # torch and gRPC object (measured at seconds per peer): the process ends anyway.
    gc.freeze()
    return status


def _user_code_note(config: Config, image: str) -> None:
    """Say that the peers' image must import the users' code the config names by import
    path (``algorithm.name``, ``model.name``, ``data.dataset``, ``data.stream``)."""
    named = [
        f"{key} = {value!r}"
        for key, value in (
            ("algorithm.name", config.algorithm.name),
            ("model.name", config.model.name),
            ("data.dataset", config.data.dataset),
            ("data.stream", config.data.stream),
        )
        if ":" in value
    ]
    if named:
        print(
            f"note: the peers in image {image} must import your code too ({'; '.join(named)}): "
            "install it in the image, or copy it to a folder on the image's PYTHONPATH."
        )


def _compose(args: argparse.Namespace) -> int:
    from fedcore.config import load_config

    config = load_config(args.config, args.overrides)
    from fedcore.deploy.compose import source_root, write_compose

    if args.swarm:
        return _stack(args, config)
    if args.place:
        raise ConfigError("--place pins the services of a swarm stack; it needs --swarm.")
    nodes = [n.strip() for n in args.nodes.split(",") if n.strip()] if args.nodes else None
    for n in nodes or ():
        check_node_id(n, "--nodes", ConfigError)
    path = write_compose(
        config, args.out, image=args.image, port=args.port, nodes=nodes, roster=args.roster
    )
    out = path.parent
    print(f"wrote {path} (with config.toml, roster.json and nodes/<id>/ beside it)")
    if args.quiet:
        return 0
    print("next steps:")
    if source_root() is None:
        print(f"  docker build -t {args.image} -f nodes/Dockerfile .   # in a fedcore checkout")
    print(f"  cd {out} && docker-compose up --build   # or: docker compose up --build")
    if args.roster:
        print("  (on every host, with the same config and roster and that host's --nodes)")
        print(f"  copy every host's {out}/nodes/<id>/ into one nodes/ folder, then:")
    print("  fedcore summarize .                     # in that folder, after the run")
    if config.run.checkpoint_every == 0:
        print(
            "note: run.checkpoint_every = 0, so a restarted container starts again from "
            "round 0; set it (--set run.checkpoint_every=25) to resume from checkpoints."
        )
    _user_code_note(config, args.image)
    return 0


def _stack(args: argparse.Namespace, config: Config) -> int:
    from fedcore.deploy.swarm import HOST_LABEL, write_stack

    if args.nodes or args.roster:
        raise ConfigError(
            "--nodes and --roster split a compose deployment over hosts by hand; a swarm "
            "stack spans its hosts itself (pin peers with --place ID=HOST instead)."
        )
    placement: dict[str, str] = {}
    for item in (args.place or "").split(","):
        if not item.strip():
            continue
        node, sep, host = (part.strip() for part in item.partition("="))
        if not sep:
            raise ConfigError(f"--place {item.strip()!r} is not ID=HOST (e.g. n0=host-a).")
        if node in placement:
            raise ConfigError(f"--place names {node} twice.")
        placement[node] = host
    path = write_stack(config, args.out, image=args.image, port=args.port, placement=placement)
    print(f"wrote {path} (with config.toml, roster.json and gather.sh beside it)")
    if args.quiet:
        return 0
    print("next steps:")
    print(f"  make image {args.image} available on every host (docker build / docker load)")
    if placement:
        hosts = sorted(set(placement.values()))
        print(
            f"  label the hosts: docker node update --label-add {HOST_LABEL}=HOST NODE"
            f"   (HOST in {', '.join(hosts)})"
        )
    print(f"  cd {path.parent} && docker stack deploy -c docker-stack.yml fedcore   # a manager")
    print(
        "  after the run, on every host: sh gather.sh fedcore; then, with every host's "
        "nodes/<id>/ here: fedcore summarize ."
    )
    if config.run.checkpoint_every == 0:
        print(
            "note: run.checkpoint_every = 0, so a restarted peer starts again from round 0; "
            "set it (--set run.checkpoint_every=25) to resume from checkpoints."
        )
    _user_code_note(config, args.image)
    return 0


def _k8s(args: argparse.Namespace) -> int:
    from fedcore.config import load_config

    config = load_config(args.config, args.overrides)
    from fedcore.deploy.k8s import Resources, kubectl_steps, write_k8s

    resources = Resources(
        cpu=args.cpu,
        memory=args.memory,
        cpu_limit=args.cpu_limit,
        memory_limit=None if args.memory_limit in ("0", "") else args.memory_limit,
        storage=args.storage,
        storage_class=args.storage_class,
    )
    folder = write_k8s(
        config,
        args.out,
        image=args.image,
        port=args.port,
        name=args.name,
        namespace=args.namespace,
        cluster_domain=args.cluster_domain,
        resources=resources,
    )
    print(f"wrote {folder}/ (with kustomization.yaml, gather.sh and config.toml beside it)")
    if args.quiet:
        return 0
    print("next steps:")
    for step in kubectl_steps(
        folder.parent, name=args.name, namespace=args.namespace, image=args.image
    ):
        print(f"  {step}")
    if config.run.checkpoint_every == 0:
        print(
            "note: run.checkpoint_every = 0, so a restarted pod starts again from round 0; "
            "set it (--set run.checkpoint_every=25) to resume from checkpoints."
        )
    _user_code_note(config, args.image)
    return 0


def _summarize(args: argparse.Namespace) -> int:
    from fedcore.config import load_config
    from fedcore.deploy.launch import summarize

    config = load_config(args.config) if args.config else None
    summary = summarize(args.run_dir, config)
    if not args.quiet:
        _print_table(summary)
    return 0


def _certs(args: argparse.Namespace) -> int:
    from fedcore.certs import init_certs

    nodes: list[str] = list(args.nodes or [])
    for n in nodes:
        check_node_id(n, "--nodes", ConfigError)
    if args.config:
        from fedcore.config import load_config
        from fedcore.setup.plan import build_topology

        nodes += build_topology(load_config(args.config).topology).nodes
    if not nodes:
        raise ConfigError("certs init needs --nodes ID... or --config FILE.")
    written = init_certs(nodes, args.out, days=args.days, force=args.force)
    issued = sorted({p.stem for p in written if p.suffix == ".crt" and p.stem != "ca"})
    if args.quiet:
        return 0
    print(
        f"{args.out}: {len(issued)} node certificate(s) issued"
        + (f" ({', '.join(issued)})" if issued else " (all existed)")
        + ("; a new CA" if any(p.name == "ca.crt" for p in written) else "")
        + f". Keep {Path(args.out) / 'ca.key'} off the peers."
    )
    return 0


def _health(args: argparse.Namespace) -> int:
    import asyncio

    from fedcore.certs import load_tls
    from fedcore.transport.grpc.channel import probe_health

    tls = None
    if args.node_id is not None:
        check_node_id(args.node_id, "--id", ConfigError)
    if args.config:
        from fedcore.config import load_config

        tls_dir = load_config(args.config).transport.tls_dir
        if tls_dir is not None:
            if not args.node_id:
                raise ConfigError("health over TLS needs --id (whose certificate to use).")
            tls = load_tls(tls_dir, args.node_id)
    status = asyncio.run(
        probe_health(args.address, tls=tls, peer=args.node_id or "", timeout_s=args.timeout)
    )
    print(status)
    return 0 if status == "SERVING" else EXIT_RUNTIME


def _topology_show(args: argparse.Namespace) -> int:
    from fedcore import topology
    from fedcore.topology.io import SUFFIXES as FILE_SUFFIXES

    spec: str = args.spec
    path = Path(spec)
    looks_like_file = path.exists() or path.suffix in FILE_SUFFIXES
    # A missing graph file is reported by load() as such, not as a bad spec.
    graph = topology.load(path) if looks_like_file else topology.parse_spec(spec)
    print(topology.describe(graph))
    return 0


PLOT_FORMATS = (".png", ".pdf", ".svg")
"""File types ``fedcore plot --out`` writes (by the name's suffix)."""


def _plot(args: argparse.Namespace) -> int:
    from fedcore.plotting import plot_runs

    target = Path(args.out)
    if target.suffix.lower() not in PLOT_FORMATS:
        raise ConfigError(
            f"fedcore plot --out {clip(args.out)}: the file name must end in "
            f"{', '.join(PLOT_FORMATS)} (the picture's format), e.g. --out curves.png."
        )
    out = plot_runs(
        [Path(r) for r in args.runs],
        target,
        label=args.label,
        title=args.title,
        log_bytes=args.log_bytes,
        bands=args.bands,
    )
    if not args.quiet:
        print(f"wrote {out}")
    return 0


def _error_line(exc: BaseException, verbose: int) -> str:
    """One line for ``exc``: its message's first line, and a pointer to ``-v`` when a
    traceback (of code that raised inside a user's factory, torch ...) stands behind it."""
    text = first_line(str(exc)) or type(exc).__name__
    cause = exc.__cause__
    foreign = cause is not None and not isinstance(
        cause,
        FedcoreError | OSError | UnicodeError | tomllib.TOMLDecodeError | json.JSONDecodeError,
    )
    if foreign and not verbose:
        text += " (add -v to see the traceback)"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    verbose = args.verbose + getattr(args, "sub_verbose", 0)
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    # -v and -vv are about fedcore; other libraries (matplotlib's font search, grpc)
    # speak at DEBUG only from -vvv.
    logging.basicConfig(
        level=logging.DEBUG if verbose >= 3 else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    ours = logging.getLogger("fedcore")
    before = ours.level
    ours.setLevel(level)
    try:
        return _dispatch(args, verbose)
    finally:
        ours.setLevel(before)  # main() called in-process (tests) leaves logging as it was


def _dispatch(args: argparse.Namespace, verbose: int) -> int:
    # Let "pkg.module:factory" names resolve against the working directory, as
    # `python -m` would; the console script otherwise only sees its own folder.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    handlers = {
        "simulate": _simulate,
        "launch": _launch,
        "node": _node,
        "compose": _compose,
        "k8s": _k8s,
        "summarize": _summarize,
        "certs": _certs,
        "health": _health,
        "topology": _topology_show,
        "plot": _plot,
    }
    try:
        return handlers[args.command](args)
    except FedcoreError as exc:
        if verbose:
            traceback.print_exception(exc, file=sys.stderr)
        print(f"fedcore: error: {_error_line(exc, verbose)}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, ValueError) else EXIT_RUNTIME
    except MemoryError as exc:  # a size no bound caught: say so, without a traceback
        if verbose:
            traceback.print_exception(exc, file=sys.stderr)
        print(
            "fedcore: error: out of memory; use a smaller model, fewer nodes, smaller batches "
            "or fewer rounds.",
            file=sys.stderr,
        )
        return EXIT_RUNTIME
    except OSError as exc:  # an output path that cannot be written
        where = f" {exc.filename!r}" if exc.filename else ""
        print(f"fedcore: error: cannot write{where}: {exc.strerror or exc}.", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        print(f"fedcore: interrupted {exc}".rstrip(), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
