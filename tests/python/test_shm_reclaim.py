"""Regions of a client that died are reclaimed (issue #28, docs/shared_memory.md "Lifetime"): against the real server
binary with --shm-socket, a child process (started here, killed here by its pid with SIGKILL) registers regions up to
its tenant's cap and dies without unregistering; within a bounded time the tenant's ListRegions no longer shows them,
the tenant can register up to its cap again, and the metrics count them as owner_gone. A grandchild the child forked
(still alive) does not keep them: the lifelines are closed in a forked child."""

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

import orthoserve
from conftest import free_port, start_server
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc

CAP = 2  # --shm-max-regions-per-tenant
DROPPED = 'orthoserve_shm_regions_dropped_total{cause="owner_gone"}'

# The child: registers CAP regions, forks a grandchild that only sleeps, prints the ids and the grandchild's pid, then
# waits to be killed (reading stdin, which the test never closes before the kill).
CHILD = """
import os, sys, time
import orthoserve
client = orthoserve.Client(sys.argv[1], token="secret-a", timeout=30)
regions = [client.region(1 << 20, name=f"doomed-{i}") for i in range(CAP)]
grandchild = os.fork()
if grandchild == 0:
    time.sleep(120)
    os._exit(0)
print(" ".join(r.id for r in regions), grandchild, flush=True)
sys.stdin.read()
"""


def _list(client, address):
    stub = pb_grpc.SharedMemoryStub(client.channels.channel(address))
    return [r.region_id for r in stub.ListRegions(pb.ListRegionsRequest(), timeout=10,
                                                  metadata=client.channels.metadata).regions]


def _metric(port, series):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} is not in /metrics")


def _eventually(condition, timeout=10.0):
    """Polls `condition` until it holds or `timeout` seconds passed; whether it held."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _alive(pid):
    """Whether process `pid` (not ours to wait for: the child's child) still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.deadline(120)
def test_the_regions_of_a_killed_client_are_dropped_and_its_tenant_can_register_again(tmp_path):
    (tmp_path / "tokens").write_text("secret-a alice\n")
    metrics_port = free_port()
    s = start_server(tmp_path, ["--token-file", str(tmp_path / "tokens"), "--shm-socket", str(tmp_path / "shm.sock"),
                                "--shm-max-regions-per-tenant", str(CAP),
                                "--metrics-address", f"127.0.0.1:{metrics_port}"],
                     name="shm-reclaim", token="secret-a")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    child = subprocess.Popen([sys.executable, "-c", CHILD.replace("CAP", str(CAP)), s.address], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env, text=True)
    grandchild = None
    try:
        *ids, grandchild = child.stdout.readline().split()
        grandchild = int(grandchild)
        assert len(ids) == CAP, f"the child did not register its regions (exit code {child.poll()})"
        with orthoserve.Client(s.address, token="secret-a", timeout=30) as alice:
            assert sorted(_list(alice, s.address)) == sorted(ids)
            with pytest.raises(orthoserve.errors.ResourceExhaustedError, match="shm-max-regions-per-tenant"):
                alice.region(4096)

            child.kill()  # SIGKILL by pid: nothing of the child's runs again, its regions stay registered.
            child.wait(timeout=30)
            assert _eventually(lambda: _list(alice, s.address) == []), "the killed client's regions stay registered"
            assert _alive(grandchild), "the grandchild should still run (and not keep its parent's regions)"
            assert _eventually(lambda: _metric(metrics_port, DROPPED) == CAP)
            assert _eventually(lambda: _metric(metrics_port, 'orthoserve_shm_regions{memory="host"}') == 0)

            # The tenant's places are free again: up to the cap, and a region used normally.
            regions = [alice.region(1 << 16, name=f"again-{i}") for i in range(CAP)]
            g = regions[0].array((8, 8))
            g[...] = 1.0
            alice.orthogonalize(g, method="unary")
            for r in regions:
                r.close()
            assert _list(alice, s.address) == []
            # Closed after an unregister: nothing more is dropped.
            assert _metric(metrics_port, DROPPED) == CAP
    finally:
        _kill(child.pid)
        child.wait(timeout=30)
        if grandchild:
            _kill(grandchild)
        s.stop()


@pytest.mark.deadline(60)
def test_a_region_closed_by_its_owner_is_not_counted_as_dropped(tmp_path):
    metrics_port = free_port()
    s = start_server(tmp_path, ["--shm-socket", str(tmp_path / "shm.sock"),
                                "--metrics-address", f"127.0.0.1:{metrics_port}"], name="shm-closed")
    try:
        with orthoserve.Client(s.address, timeout=30) as client:
            region = client.region(1 << 16)
            lifeline = region._lifeline
            assert lifeline is not None and lifeline.fileno() >= 0
            region.close()
            assert region._lifeline is None and lifeline.fileno() == -1
            assert _list(client, s.address) == []
            assert _metric(metrics_port, DROPPED) == 0
            # A region whose lifeline ends without an unregister (as a crash would) is dropped by the server.
            region = client.region(1 << 16)
            region._lifeline.close()
            assert _eventually(lambda: _list(client, s.address) == [])
            assert _eventually(lambda: _metric(metrics_port, DROPPED) == 1)
            region.id = ""  # The server forgot it; nothing to unregister.
            region.close()
    finally:
        s.stop()
