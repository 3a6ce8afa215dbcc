"""agl-server over HTTPS (tls.certfile, tls.keyfile) with a private CA, and clients that trust it
through $SSL_CERT_FILE."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agentlightning.client import GatewayClient, GatewayUnavailable, RetryPolicy
from agentlightning.launch import start_gateway
from agentlightning.server.config import load_server_config

pytestmark = pytest.mark.process  # whole processes, waited on: not in `make test-fast`


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (its own CA) and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "agl-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def test_gateway_serves_https_and_clients_trust_its_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed(tmp_path)
    # Ready once it answers over TLS with a certificate the CA (the certificate itself) vouches for.
    proc = start_gateway(
        key="k",
        store_url="memory://",
        tls=(cert, key),
        log_path=tmp_path / "gateway.log",
        name="agl-server-tls",
    )
    url = proc.url
    assert url.startswith("https://")
    try:
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        with GatewayClient(url, "k") as client:
            assert client.health()
            [r] = client.create_rollouts([{"rollout_id": "tls", "input": 1}])
            assert r.rollout_id == "tls"
        monkeypatch.delenv("SSL_CERT_FILE")
        with GatewayClient(url, "k", retry=RetryPolicy(attempts=1)) as stranger:  # the system's CAs
            with pytest.raises(GatewayUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
                stranger.health()
        with pytest.raises(httpx.TransportError):  # plain HTTP on the TLS port is not served
            httpx.get(url.replace("https://", "http://") + "/healthz", timeout=10)
    finally:
        proc.stop()


def test_tls_config_needs_both_files(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    with pytest.raises(ValueError, match="together"):
        load_server_config({"tls": {"certfile": str(cert)}})
    with pytest.raises(ValueError, match="no such file"):
        load_server_config({"tls": {"certfile": str(cert), "keyfile": str(tmp_path / "missing.pem")}})
    assert load_server_config({"tls": {"certfile": str(cert), "keyfile": str(key)}}).tls.enabled
