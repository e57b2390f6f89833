"""Certificates for mutual TLS between peers (``fedcore certs init``, ``[transport.tls]``).

One certificate authority per deployment, one key and certificate per node. A node's
certificate carries its node id as a DNS subject alternative name: that name is the
identity its peers hold it to, both when it serves (the client checks the server is the
peer it meant to reach) and when it sends (the server checks the sender a message names is
the one its certificate names). Keys are ECDSA P-256.

The folder layout, which ``[transport.tls] dir`` points at::

    ca.crt          the CA certificate every peer trusts (public)
    ca.key          the CA's key: keep it off the peers; only needed to add nodes
    <id>.crt        node <id>'s certificate, signed by the CA
    <id>.key        node <id>'s private key (mode 0600)
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedcore.errors import ConfigError
from fedcore.ids import NODE_ID_RULE, child_path, clip, id_problem

__all__ = ["TlsFiles", "cert_node_ids", "check_tls_dir", "init_certs", "load_tls"]

CA_CERT = "ca.crt"
CA_KEY = "ca.key"


def _name(common: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fedcore"),
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    """Write atomically; private files are created with mode 0600."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    tmp.replace(path)


def _check_id(node: object) -> str:
    """``node`` if it is a safe node id that may name ``<id>.crt`` (not the CA's ``ca``)."""
    problem = id_problem(node)
    if problem is not None:
        raise ConfigError(
            f"node id {clip(node, 40)} cannot name a certificate: {problem}. Node ids are "
            f"{NODE_ID_RULE} (a certificate carries the id as a DNS name)."
        )
    if node == "ca":
        raise ConfigError("node id 'ca' cannot name a certificate: ca.crt is the CA's.")
    assert isinstance(node, str)
    return node


def _files(folder: Path, node: str) -> tuple[Path, Path]:
    """``folder/<node>.crt`` and ``folder/<node>.key``, checked to stay in ``folder``."""
    return (
        child_path(folder, f"{node}.crt", ConfigError),
        child_path(folder, f"{node}.key", ConfigError),
    )


def _new_ca(days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("fedcore CA"))
        .issuer_name(_name("fedcore CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _node_cert(
    node: str, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, days: int
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(node))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(node)]), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def init_certs(
    nodes: Iterable[str], out: str | Path, *, days: int = 365, force: bool = False
) -> list[Path]:
    """Make (or extend) the certificate folder ``out`` for ``nodes``; return the files written.

    A folder that already has ``ca.crt`` and ``ca.key`` keeps its CA, and only nodes without
    a good certificate get one (none yet, or one this CA did not sign, or expired). ``force``
    makes a new CA and issues every certificate in the folder anew, ``nodes``' and the rest.

    Raises:
        ConfigError: a node id that cannot name a certificate, no nodes, or a folder with
            a CA certificate but not its key.
    """
    ids = list(dict.fromkeys(nodes))
    if not ids:
        raise ConfigError("certs init needs at least one node id (--nodes n0 n1 ...).")
    for node in ids:
        _check_id(node)
    if days < 1:
        raise ConfigError(f"--days must be >= 1, got {days}.")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    ca_cert_path, ca_key_path = folder / CA_CERT, folder / CA_KEY
    new_ca = force or not ca_cert_path.exists()
    if not new_ca:
        if not ca_key_path.exists():
            raise ConfigError(
                f"{ca_cert_path} exists without its key {CA_KEY}: new node certificates need "
                "the CA's key (or use --force for a new CA, which invalidates every old one)."
            )
        ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
        loaded = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise ConfigError(f"{ca_key_path} is not an EC key written by fedcore certs init.")
        ca_key = loaded
    else:
        ca_key, ca_cert = _new_ca(days)
        _write(ca_key_path, _pem_key(ca_key), private=True)
        _write(ca_cert_path, ca_cert.public_bytes(serialization.Encoding.PEM))
        written += [ca_cert_path, ca_key_path]
    if force:  # every certificate the old CA signed is worthless now
        others = sorted({p.stem for p in folder.glob("*.crt")} - {"ca", *ids})
        ids += [n for n in others if id_problem(n) is None]  # not a stray file's name
    for node in ids:
        cert_path, key_path = _files(folder, node)
        if not new_ca and key_path.exists() and _issued_by(cert_path, ca_cert):
            continue  # already issued by this CA, and valid
        key, cert = _node_cert(node, ca_key, ca_cert, days)
        _write(key_path, _pem_key(key), private=True)
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
        written += [cert_path, key_path]
    return written


def _unfit(cert: x509.Certificate, ca: x509.Certificate) -> str | None:
    """Why ``cert`` cannot serve under ``ca`` now (not signed by it, or not valid now)."""
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "was not signed by the CA"
    now = datetime.datetime.now(datetime.UTC)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        return (
            f"is valid from {cert.not_valid_before_utc:%Y-%m-%d} to "
            f"{cert.not_valid_after_utc:%Y-%m-%d}, not now"
        )
    return None


def _issued_by(path: Path, ca: x509.Certificate) -> bool:
    """Whether ``path`` holds a certificate that ``ca`` signed and that is valid now."""
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return False
    return _unfit(cert, ca) is None


_LISTED = 4
"""Missing files :func:`check_tls_dir` names before it counts the rest."""


def check_tls_dir(
    tls_dir: str | Path, nodes: Iterable[str], *, config: str | Path | None = None
) -> None:
    """Check, before any peer starts, that ``tls_dir`` has what every peer will read.

    That is ``ca.crt`` and each node's ``<id>.crt`` and ``<id>.key`` (not ``ca.key``, which
    stays off the peers). Only presence is checked here, so it is cheap for many nodes;
    :func:`load_tls` checks each peer's files in full when it starts.

    Args:
        tls_dir: The certificate folder (``transport.tls.dir``).
        nodes: The node ids of the run.
        config: The config file, named in the fix (``CONFIG`` when not given).

    Raises:
        ConfigError: one line naming the folder, what is missing (the folder itself, or
            the first few missing files and how many more) and the ``fedcore certs init``
            command that makes them.
    """
    folder = Path(tls_dir)
    fix = (
        f"make the certificates with: fedcore certs init --config "
        f"{config if config is not None else 'CONFIG'} --out {folder}"
    )
    if not folder.exists():
        raise ConfigError(f"transport.tls.dir {folder} does not exist; {fix}.")
    if not folder.is_dir():
        raise ConfigError(
            f"transport.tls.dir {folder} is not a folder; point it at the folder "
            f"fedcore certs init writes, or {fix}."
        )
    names = [CA_CERT]
    for node in dict.fromkeys(nodes):
        _check_id(node)
        names += [path.name for path in _files(folder, node)]
    missing = [name for name in names if not (folder / name).is_file()]
    if not missing:
        return
    listed = ", ".join(missing[:_LISTED])
    more = f" and {len(missing) - _LISTED} more" if len(missing) > _LISTED else ""
    raise ConfigError(f"transport.tls.dir {folder} has no {listed}{more}; {fix}.")


def cert_node_ids(cert_pem: bytes) -> list[str]:
    """The node ids (DNS subject alternative names) a PEM certificate names."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return list(san.get_values_for_type(x509.DNSName))


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """One node's TLS material, as PEM bytes."""

    ca: bytes
    cert: bytes
    key: bytes


def load_tls(folder: str | Path, node_id: str) -> TlsFiles:
    """Read ``ca.crt``, ``<node_id>.crt`` and ``<node_id>.key`` from ``folder``, checking
    that the certificate names ``node_id`` and that the CA signed it.

    Raises:
        ConfigError: a node id that cannot name a certificate, a missing or unreadable
            file, or a certificate that does not belong.
    """
    base = Path(folder)
    _check_id(node_id)
    cert_path, key_path = _files(base, node_id)
    paths = {"ca": base / CA_CERT, "cert": cert_path, "key": key_path}
    data: dict[str, bytes] = {}
    for role, path in paths.items():
        try:
            data[role] = path.read_bytes()
        except OSError as exc:
            raise ConfigError(
                f"transport.tls: cannot read {path} ({exc.strerror}); make the certificates "
                f"with: fedcore certs init --nodes {node_id} ... --out {base}"
            ) from exc
    try:
        ca = x509.load_pem_x509_certificate(data["ca"])
        cert = x509.load_pem_x509_certificate(data["cert"])
        key = serialization.load_pem_private_key(data["key"], password=None)
    except ValueError as exc:
        raise ConfigError(f"transport.tls: a file in {base} is not valid PEM: {exc}.") from exc
    if key.public_key() != cert.public_key():
        raise ConfigError(f"transport.tls: {paths['key']} is not the key of {paths['cert']}.")
    names = cert_node_ids(data["cert"])
    if node_id not in names:
        raise ConfigError(
            f"transport.tls: {paths['cert']} names {names or 'no node'}, not {node_id!r}."
        )
    why = _unfit(cert, ca)
    if why is not None:
        raise ConfigError(
            f"transport.tls: {paths['cert']} {why} (CA: {paths['ca']}); issue a new one with "
            f"fedcore certs init --nodes {node_id} --out DIR, in the folder that has ca.key."
        )
    return TlsFiles(ca=data["ca"], cert=data["cert"], key=data["key"])
