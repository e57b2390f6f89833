"""``fedcore k8s``: Kubernetes manifests, one StatefulSet per peer."""

from __future__ import annotations

import argparse

from fedcore.cli.common import CONFIG, DEPLOY, SET, VERBOSE
from fedcore.cli.compose import deployment_notes

__all__ = ["add"]


def add(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fedcore k8s`` to ``sub``."""
    kube = sub.add_parser(
        "k8s",
        parents=[CONFIG, DEPLOY, SET, VERBOSE],
        help="write Kubernetes manifests: one StatefulSet per peer",
        description="Write DIR/k8s/ (a headless Service, a ConfigMap with the config and "
        "roster, one Secret per node with its certificate and key when [transport.tls] is "
        "set, one StatefulSet per node whose pod <id>-0 has its own volume claim for "
        "/fedcore/out), DIR/kustomization.yaml, DIR/gather.sh (copies each pod's results to "
        "DIR/nodes/<id>/ and runs `fedcore summarize DIR`) and DIR/config.toml. Quantities "
        "are Kubernetes', e.g. 500m, 2, 512Mi, 4Gi.",
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

    kube.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from fedcore.config import load_config

    config = load_config(args.config, args.overrides)
    from fedcore.deploy.k8s import kubectl_steps, write_k8s
    from fedcore.deploy.k8s_statefulset import Resources

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
    deployment_notes(config, args.image, "pod")
    return 0
