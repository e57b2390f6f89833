"""Mutual TLS: certificates (``fedcore certs init``), identities bound to the trust graph.

What must hold: a peer whose certificate another CA signed, whose certificate names another
node id than it claims, or that has no certificate is refused, and the others' run goes on.
"""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import grpc
import pytest
import torch

from fedcore.certs import TlsFiles, cert_node_ids, init_certs, load_tls
from fedcore.cli import main as cli
from fedcore.compression import RawCodec
from fedcore.config import load_config
from fedcore.deploy.launch import launch
from fedcore.errors import ConfigError, UntrustedPeerError
from fedcore.messages import Message
from fedcore.node import Node, RoundRecord
from fedcore.setup.prepare import prepare_run
from fedcore.simulation.simulate import simulate
from fedcore.transport.grpc import GrpcTransport
from fedcore.transport.grpc.channel import open_channel, probe_health
from fedcore.transport.grpc.serde import message_to_wire
from fedcore.transport.grpc.transport import _PUSH

RUN = "run-fingerprint"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A deployment's CA with nodes a, b, c, and a second CA that also has an "a"."""
    base = tmp_path_factory.mktemp("pki")
    init_certs(["a", "b", "c"], base / "good")
    init_certs(["a"], base / "other")
    return {"good": base / "good", "other": base / "other"}


# ---------------------------------------------------------------- certificates


def test_certs_init_writes_a_ca_and_one_certificate_per_node(tmp_path: Path) -> None:
    other = tmp_path / "other"
    init_certs(["n1"], other)
    tmp_path = tmp_path / "mine"
    written = init_certs(["n0", "n1"], tmp_path)
    assert sorted(p.name for p in written) == [
        "ca.crt", "ca.key", "n0.crt", "n0.key", "n1.crt", "n1.key",
    ]  # fmt: skip
    for key in ("ca.key", "n0.key", "n1.key"):
        assert stat.S_IMODE((tmp_path / key).stat().st_mode) == 0o600
    assert cert_node_ids((tmp_path / "n1.crt").read_bytes()) == ["n1"]
    assert load_tls(tmp_path, "n0").cert == (tmp_path / "n0.crt").read_bytes()
    # Again: the CA stays and only the new node is issued a certificate.
    ca = (tmp_path / "ca.crt").read_bytes()
    again = init_certs(["n0", "n1", "n2"], tmp_path)
    assert [p.name for p in again] == ["n2.crt", "n2.key"]
    assert (tmp_path / "ca.crt").read_bytes() == ca
    load_tls(tmp_path, "n2")
    # --force: a new CA, and every certificate in the folder anew (not only those named).
    assert len(init_certs(["n0"], tmp_path, force=True)) == 8
    assert (tmp_path / "ca.crt").read_bytes() != ca
    for node in ("n0", "n1", "n2"):
        load_tls(tmp_path, node)
    # A certificate another CA signed is issued anew, without --force.
    (tmp_path / "n1.crt").write_bytes((other / "n1.crt").read_bytes())
    assert [p.name for p in init_certs(["n1"], tmp_path)] == ["n1.crt", "n1.key"]
    load_tls(tmp_path, "n1")
    with pytest.raises(ConfigError, match="'ca' cannot name a certificate"):
        init_certs(["ca"], tmp_path)


def test_load_tls_refuses_what_does_not_belong(tmp_path: Path, pki: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=r"cannot read .*zed\.crt.*certs init"):
        load_tls(pki["good"], "zed")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "ca.crt").write_bytes((pki["good"] / "ca.crt").read_bytes())
    for suffix in (".crt", ".key"):
        (mixed / f"a{suffix}").write_bytes((pki["other"] / f"a{suffix}").read_bytes())
        (mixed / f"b{suffix}").write_bytes((pki["good"] / f"c{suffix}").read_bytes())
    with pytest.raises(ConfigError, match="not signed by the CA"):
        load_tls(mixed, "a")
    with pytest.raises(ConfigError, match=r"names \['c'\], not 'b'"):
        load_tls(mixed, "b")
    (mixed / "a.crt").write_text("not a certificate")
    with pytest.raises(ConfigError, match="not valid PEM"):
        load_tls(mixed, "a")


def test_certs_init_refuses_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot name a certificate"):
        init_certs(["n0", "a b"], tmp_path)
    with pytest.raises(ConfigError, match="at least one node"):
        init_certs([], tmp_path)
    init_certs(["n0"], tmp_path / "x")
    (tmp_path / "x" / "ca.key").unlink()
    with pytest.raises(ConfigError, match="without its key"):
        init_certs(["n1"], tmp_path / "x")


def test_tls_table_is_validated_and_not_part_of_the_fingerprint() -> None:
    config = load_config(None, ["transport.tls.dir=certs", "topology.nodes=4"])
    assert config.transport.tls_dir == Path.cwd() / "certs"  # a --set path is the cwd's
    plain = load_config(None, ["topology.nodes=4"])
    assert prepare_run(config).run_id == prepare_run(plain).run_id
    with pytest.raises(ConfigError, match=r"unknown key transport\.tls\.ca"):
        load_config(None, ["transport.tls.ca=x"])
    with pytest.raises(ConfigError, match=r"transport\.tls\.dir"):
        load_config(None, ["transport.tls={dir = 3}"])


def test_certs_cli_takes_the_nodes_of_a_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[topology]\nkind = 'ring'\nnodes = 3\n")
    assert cli(["certs", "init", "--config", str(config), "--out", str(tmp_path / "c")]) == 0
    assert "3 node certificate(s) issued (n0, n1, n2); a new CA" in capsys.readouterr().out
    assert cli(["certs", "init", "--nodes", "n0", "--out", str(tmp_path / "c")]) == 0
    assert "(all existed)" in capsys.readouterr().out
    assert cli(["certs", "init", "--out", str(tmp_path / "d")]) == 2
    assert "needs --nodes" in capsys.readouterr().err


# ---------------------------------------------------------------- refusals over the wire


def _message(sender: str, receiver: str = "b") -> Message:
    tensor = RawCodec().encode(torch.ones(4))
    return Message(
        run=RUN, round=0, phase=0, sender=sender, receiver=receiver, tensors={"x": tensor}
    )


async def _push(
    address: str, message: Message, credentials: TlsFiles | bytes | None, peer: str = "b"
) -> str:
    """Push ``message`` over mutual TLS (TlsFiles), TLS without a client certificate (the
    CA's bytes only) or plaintext (None); return the status code's name (OK: accepted)."""
    if isinstance(credentials, bytes):
        options = [("grpc.ssl_target_name_override", peer)]
        ssl = grpc.ssl_channel_credentials(root_certificates=credentials)
        channel = grpc.aio.secure_channel(address, ssl, options=options)
    else:
        channel = open_channel(address, credentials, peer)
    try:
        push = channel.stream_unary(_PUSH)
        await push(message_to_wire(message), timeout=5)
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    finally:
        await channel.close()
    return "OK"


@pytest.mark.grpc
def test_only_the_certified_trusted_sender_gets_through(pki: dict[str, Path]) -> None:
    """b trusts a. Over mutual TLS, only a holding a's certificate from b's CA is heard."""
    good = {n: load_tls(pki["good"], n) for n in "abc"}

    async def main() -> tuple[dict[str, str], int]:
        b = GrpcTransport(
            "b", listen="127.0.0.1:0", roster={}, run_id=RUN, trusted={"a"}, tls=good["b"]
        )
        port = await b.start()
        address = f"127.0.0.1:{port}"
        try:
            codes = {
                "a, certified": await _push(address, _message("a"), good["a"]),
                "a, other CA": await _push(address, _message("a"), load_tls(pki["other"], "a")),
                "a, no certificate": await _push(address, _message("a"), good["a"].ca),
                "a, plaintext": await _push(address, _message("a"), None),
                "c's certificate claiming a": await _push(address, _message("a"), good["c"]),
                "c, certified, untrusted": await _push(address, _message("c"), good["c"]),
                # The client checks the server too: b's address answering as someone else.
                "a, expecting c at b's address": await _push(
                    address, _message("a"), good["a"], peer="c"
                ),
                "a, again": await _push(address, _message("a"), good["a"]),
            }
            inbox = await b.collect(0, 0, ["a"], timeout=1.0)
            assert set(inbox) == {"a"}
            status = await probe_health(address, tls=good["a"], peer="b")
            assert status == "SERVING"
        finally:
            await b.close(0.1)
        return codes, b.stats.messages_rejected

    codes, rejected = asyncio.run(main())
    assert codes == {
        "a, certified": "OK",
        "a, other CA": "UNAVAILABLE",  # refused in the TLS handshake
        "a, no certificate": "UNAVAILABLE",
        "a, plaintext": "UNAVAILABLE",
        "c's certificate claiming a": "PERMISSION_DENIED",
        "c, certified, untrusted": "PERMISSION_DENIED",
        "a, expecting c at b's address": "UNAVAILABLE",
        "a, again": "OK",
    }
    assert rejected == 2  # the two that reached the servicer


@pytest.mark.grpc
def test_connect_is_refused_for_an_impostor_and_tolerated_for_a_stranger(
    pki: dict[str, Path],
) -> None:
    good = {n: load_tls(pki["good"], n) for n in "abc"}

    async def main() -> list[str]:
        b = GrpcTransport(
            "b", listen="127.0.0.1:0", roster={}, run_id=RUN, trusted={"a"}, tls=good["b"]
        )
        port = await b.start()
        roster = {"b": f"127.0.0.1:{port}"}
        impostor = GrpcTransport(
            "a", listen="127.0.0.1:0", roster=roster, run_id=RUN, trusted=(), tls=good["c"]
        )
        stranger = GrpcTransport(
            "a", listen="127.0.0.1:0", roster=roster, run_id=RUN, trusted=(),
            tls=load_tls(pki["other"], "a"),
        )  # fmt: skip
        try:
            with pytest.raises(UntrustedPeerError, match="certificate names c claimed to be 'a'"):
                await impostor.connect(["b"], timeout_s=5)
            return await stranger.connect(["b"], timeout_s=0.5, required=False)
        finally:
            for t in (impostor, stranger, b):
                await t.close(0.1)

    assert asyncio.run(main()) == ["b"]


@pytest.mark.grpc
def test_run_goes_on_without_a_peer_from_another_ca(tmp_path: Path) -> None:
    """Four peers in deadline mode; n3 holds a certificate another CA signed. The others
    refuse it (and it them); they finish every round, hearing each other every time."""
    init_certs(["n0", "n1", "n2", "n3"], tmp_path / "good")
    init_certs(["n3"], tmp_path / "other")
    config = load_config(
        None,
        [
            "topology.kind=ring", "topology.nodes=4", "algorithm.name=dpsgd", "run.rounds=14",
            "transport.mode=deadline", "transport.deadline_s=0.3",
        ],
    )  # fmt: skip
    setup = prepare_run(config)
    records: dict[str, list[RoundRecord]] = {n: [] for n in setup.graph.nodes}

    def observe(node: Node, record: RoundRecord) -> None:
        records[node.id].append(record)

    async def main() -> None:
        transports = {}
        for n in setup.graph.nodes:
            tls = load_tls(tmp_path / ("other" if n == "n3" else "good"), n)
            transports[n] = GrpcTransport(
                n, listen="127.0.0.1:0", roster={}, run_id=setup.run_id,
                trusted=set(setup.graph.at(0).in_neighbours(n)), tls=tls,
            )  # fmt: skip
        nodes = {n: setup.make_node(n, t, observer=observe) for n, t in transports.items()}
        for n, t in transports.items():
            t.validator = nodes[n].validate
            await t.start()
        roster = {n: f"127.0.0.1:{t.port}" for n, t in transports.items()}
        for t in transports.values():
            t.roster = roster

        async def peer(n: str) -> list[str]:
            outs = setup.graph.at(0).out_neighbours(n)
            unreachable = await transports[n].connect(outs, timeout_s=1.0, required=False)
            await nodes[n].run(config.run.rounds)
            return unreachable

        try:
            unreachable = await asyncio.gather(*(peer(n) for n in setup.graph.nodes))
        finally:
            for t in transports.values():
                await t.close(0.1)
        assert dict(zip(setup.graph.nodes, unreachable, strict=True)) == {
            "n0": ["n3"], "n1": [], "n2": ["n3"], "n3": ["n0", "n2"],
        }  # fmt: skip

    asyncio.run(main())
    heard_nothing_from = {"n0": ["n3"], "n1": [], "n2": ["n3"], "n3": ["n0", "n2"]}
    for n, mine in records.items():
        assert [r.round for r in mine] == list(range(config.run.rounds))
        if n == "n1":
            # n0 and n2 spent the startup timeout on n3, so n1 began about three deadlines
            # ahead of them; their late messages make it wait for them until they are in
            # step (transport/mailbox.py), and from then on it hears them every round.
            mine = mine[-4:]
        assert all(sorted(r.missing) == heard_nothing_from[n] for r in mine), (
            n, [(r.round, r.missing) for r in mine],
        )  # fmt: skip


@pytest.mark.grpc
def test_launch_over_mutual_tls_is_the_simulated_run(tmp_path: Path) -> None:
    """What a user runs: certs init, then launch with [transport.tls]; bit-identical."""
    assert (
        cli(["certs", "init", "--nodes", "n0", "n1", "n2", "n3", "--out", str(tmp_path / "c")]) == 0
    )
    overrides = ["topology.nodes=4", "run.rounds=10", "run.eval_every=5"]
    plain = load_config(None, [*overrides, "simulate.engine=messages"])
    secure = load_config(None, [*overrides, f"transport.tls.dir={tmp_path / 'c'}"])
    sim = simulate(plain, out_dir=tmp_path / "sim", show_progress=False)
    run = launch(secure, out_dir=tmp_path / "launch", show_progress=False)
    assert run["params_sha256"] == sim["params_sha256"]
    assert run["traffic"]["messages_missing"] == 0


@pytest.mark.grpc
def test_health_cli_over_tls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    init_certs(["b", "c"], tmp_path / "certs")
    config = tmp_path / "c.toml"
    config.write_text(f"[transport.tls]\ndir = '{tmp_path / 'certs'}'\n")

    async def serve_then_probe() -> list[int]:
        b = GrpcTransport(
            "b", listen="127.0.0.1:0", roster={}, run_id=RUN, trusted=(),
            tls=load_tls(tmp_path / "certs", "b"),
        )  # fmt: skip
        port = await b.start()
        address = f"127.0.0.1:{port}"
        try:
            loop = asyncio.get_running_loop()
            runs = [
                ["health", address, "--config", str(config), "--id", "b"],
                ["health", address, "--config", str(config), "--id", "c", "--timeout", "1"],
                ["health", address, "--config", str(config)],
            ]
            return [await loop.run_in_executor(None, cli, argv) for argv in runs]
        finally:
            await b.close(0.1)

    assert asyncio.run(serve_then_probe()) == [0, 1, 2]
    out, err = capsys.readouterr()
    assert out.strip() == "SERVING"
    assert "UNAVAILABLE" in err and "needs --id" in err
