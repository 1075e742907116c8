"""A client none of whose addresses has ever connected (a typo, a server that is not running, a TLS mismatch) gives one
clear error within about orthoserve.channels.NEVER_CONNECTED_PATIENCE seconds instead of retrying for the policy's
whole deadline (120 s by default), then fails each call at once — until a channel connects, when the retry policy
holds again."""

import logging
import time

import numpy as np
import pytest

import orthoserve
from orthoserve import channels
from conftest import ServerProcess, free_port, require_binary


@pytest.mark.deadline(120)
def test_a_client_that_never_connected_fails_fast_and_recovers_when_the_server_comes(tmp_path, caplog):
    port = free_port()
    address = f"127.0.0.1:{port}"
    x = np.random.default_rng(1).standard_normal((8, 6)).astype(np.float32)
    client = orthoserve.Client(address, timeout=5)  # The default retry policy: a 120 s deadline.
    try:
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="orthoserve"):
            with pytest.raises(orthoserve.UnavailableError, match="has ever connected") as first:
                client.orthogonalize(x)
        took = time.monotonic() - started
        assert channels.NEVER_CONNECTED_PATIENCE <= took < channels.NEVER_CONNECTED_PATIENCE + 10, took
        assert "check the address" in str(first.value)
        retries = [r for r in caplog.records if "retrying" in r.getMessage()]
        assert 0 < len(retries) < 40, len(retries)
        # From now on one attempt per call, failing at once.
        started = time.monotonic()
        with pytest.raises(orthoserve.UnavailableError, match="has ever connected"):
            client.orthogonalize(x)
        assert time.monotonic() - started < 3

        # The server comes up at that address: the client connects again and answers.
        server = ServerProcess([str(require_binary()), "--listen", address, "--backend", "cpu",
                                "--metrics-address", "", "--fleet-listen", f"127.0.0.1:{free_port()}"],
                               address, tmp_path / "late.log")
        try:
            server.wait_ready()
            deadline = time.monotonic() + 30
            while True:
                try:
                    u = client.orthogonalize(x, precision="highest")
                    break
                except orthoserve.UnavailableError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            assert u.shape == x.shape
            assert client.channels.reachability.ever_connected()
        finally:
            server.stop()
    finally:
        client.close()
