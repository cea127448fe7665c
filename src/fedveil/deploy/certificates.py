"""Certificates and keys for a Flower deployment (``fedveil deploy certs``).

* TLS: a certificate authority (``ca.crt``, ``ca.key``: keep the key offline) and the
  SuperLink's certificate (``server.crt``, ``server.key``) signed by it, valid for the
  SuperLink's host names and addresses. SuperNodes and the ``flwr`` CLI trust ``ca.crt``.
* Node authentication: one EC P-384 key pair per SuperNode in OpenSSH format
  (``node-<k>``, ``node-<k>.pub``, what ``ssh-keygen -t ecdsa -b 384`` writes). Each silo
  keeps its private key; its public key is registered on the SuperLink
  (``flwr supernode register node-<k>.pub``), and a SuperLink started with
  ``--enable-supernode-auth`` refuses every node whose key is not registered.

For a real consortium the CA is the consortium's (or a public one) and each silo makes its
own key pair, sending only the ``.pub`` file; this command is the quick start for a test
federation and for the end-to-end test.

Private keys are created 0600 (never written first and chmod-ed after) and a folder this
module creates is 0700 (:mod:`.private_files`); certificates and public keys are 0644.
"""
from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .private_files import private_folder, write_private_bytes


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(path: Path, key) -> None:
    write_private_bytes(path, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption(),
    ))


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def make_tls_files(out: str | Path, hosts: list[str], days: int = 365) -> dict[str, Path]:
    """Write ``ca.crt``, ``ca.key``, ``server.crt`` and ``server.key`` for ``hosts`` under ``out``."""
    out = private_folder(out)
    now = datetime.datetime.now(datetime.timezone.utc)
    valid_from, valid_to = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_cert = (
        x509.CertificateBuilder().subject_name(_name("fedveil federation CA")).issuer_name(_name("fedveil federation CA"))
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(valid_from).not_valid_after(valid_to)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    server_cert = (
        x509.CertificateBuilder().subject_name(_name(hosts[0])).issuer_name(ca_cert.subject)
        .public_key(server_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(valid_from).not_valid_after(valid_to)
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {name: out / name for name in ("ca.crt", "ca.key", "server.crt", "server.key")}
    paths["ca.crt"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths["server.crt"].write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(paths["ca.key"], ca_key)
    _write_key(paths["server.key"], server_key)
    return paths


def make_node_keys(out: str | Path, name: str) -> tuple[Path, Path]:
    """An EC P-384 key pair for one SuperNode, OpenSSH format: (``out/name``, ``out/name.pub``)."""
    out = private_folder(out)
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = out / name, out / f"{name}.pub"
    write_private_bytes(private, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption(),
    ))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
                       + f" {name}\n".encode())
    return private, public
