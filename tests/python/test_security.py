"""TLS and bearer tokens end to end: the client's tls= and token= options against a server run with
--tls-cert/--tls-key and --token-file; failures carry UNAUTHENTICATED / UNAVAILABLE codes."""

import subprocess

import grpc
import pytest
import torch

import orthoserve
from conftest import start_server


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "key.pem"),
                    "-out", str(d / "cert.pem"), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return d


def test_bearer_token(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-alpha alpha\n")
    server = start_server(tmp_path, ["--token-file", str(tokens)], name="token", token="tok-alpha")
    try:
        x = torch.randn(6, 4)
        with orthoserve.Client(server.address, token="tok-alpha", timeout=30) as good:
            assert good.orthogonalize([x])[0].shape == x.shape
        for token in (None, "tok-wrong"):
            with orthoserve.Client(server.address, token=token, timeout=30) as bad:
                with pytest.raises(orthoserve.UnauthenticatedError) as err:
                    bad.orthogonalize([x])
                assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop()


def test_tls(tmp_path, certs):
    tls = {"root_certificates": str(certs / "cert.pem")}
    server = start_server(tmp_path, ["--tls-cert", str(certs / "cert.pem"), "--tls-key", str(certs / "key.pem")],
                          name="tls", tls=tls)
    try:
        x = torch.randn(5, 7)
        with orthoserve.Client(server.address, tls=tls, timeout=30) as client:
            assert client.info().ready
            assert client.orthogonalize([x])[0].shape == x.shape
        with orthoserve.Client(server.address, timeout=5, retry=False) as plaintext:
            with pytest.raises(orthoserve.UnavailableError):
                plaintext.info()
    finally:
        server.stop()
