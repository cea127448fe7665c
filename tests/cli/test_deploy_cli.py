"""`fedveil deploy prepare | certs | app`: the files a consortium hands around."""
from __future__ import annotations

import json
import tomllib

import pytest
import torch

from fedveil.cli.main import main
from fedveil.config import load_config
from fedveil.runtime.run_dir import config_fingerprint

pytest.importorskip("cryptography")

QUICKSTART = "examples/quickstart.toml"


def test_prepare_writes_one_folder_per_silo_holding_only_its_rows(tmp_path, capsys):
    assert main(["deploy", "prepare", QUICKSTART, "data.num_clients=6", "--out", str(tmp_path / "fed")]) == 0
    facts = json.loads((tmp_path / "fed" / "federation.json").read_text())
    config = load_config(QUICKSTART, ["data.num_clients=6"])
    assert facts["num_clients"] == 6 and facts["fingerprint"] == config_fingerprint(config.model_dump(mode="json"))
    rows = []
    for k in range(6):
        silo = torch.load(tmp_path / "fed" / f"silo-{k}" / "silo.pt", weights_only=True)
        assert silo["client_id"] == k
        rows.append(len(silo["train"]["x"]) + len(silo["test"]["x"]))
        assert json.loads((tmp_path / "fed" / f"silo-{k}" / "federation.json").read_text()) == facts
    from fedveil.runtime.dataset import build_dataset

    data = build_dataset(config.data, config.seed)  # the simulation's split, silo by silo
    assert rows == [c.num_train + len(c.test) + (0 if c.val is None else len(c.val)) for c in data.clients]
    assert main(["deploy", "prepare", QUICKSTART, "--out", str(tmp_path / "fed")]) == 2  # never over a federation
    assert "already holds a prepared federation" in capsys.readouterr().err


def test_certs_sign_the_superlink_for_its_hosts_and_make_openssh_node_keys(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    assert main(["deploy", "certs", "--out", str(tmp_path), "--host", "10.0.0.5", "--host", "link.example", "--nodes", "2"]) == 0
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((tmp_path / "server.crt").read_bytes())
    server.verify_directly_issued_by(ca)  # raises if the CA did not sign it
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]
    assert names.get_values_for_type(x509.DNSName) == ["link.example"]
    for k in range(2):
        public = (tmp_path / f"node-{k}.pub").read_text()
        assert public.startswith("ecdsa-sha2-nistp384 ")
        key = serialization.load_ssh_private_key((tmp_path / f"node-{k}").read_bytes(), None)
        assert key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode() \
            == public.split(" node-")[0]
        assert (tmp_path / f"node-{k}").stat().st_mode & 0o077 == 0  # private keys readable by the owner only


def test_the_app_carries_the_run_config_to_every_party(tmp_path):
    out = tmp_path / "app"
    assert main(["deploy", "app", QUICKSTART, "federation.rounds=2", "--federation", "fed/federation.json",
                 "--server-out", "runs/server", "--timeout", "30", "--out", str(out)]) == 0
    project = tomllib.loads((out / "pyproject.toml").read_text())
    components = project["tool"]["flwr"]["app"]["components"]
    assert components == {"serverapp": "fedveil.deploy.flower_app:server_app", "clientapp": "fedveil.deploy.flower_client:client_app"}
    settings = project["tool"]["flwr"]["app"]["config"]
    sent = json.loads(settings["config"])
    assert sent == load_config(QUICKSTART, ["federation.rounds=2"]).model_dump(mode="json")
    assert settings["timeout"] == 30.0 and settings["resume"] is False and settings["out"].endswith("runs/server")
