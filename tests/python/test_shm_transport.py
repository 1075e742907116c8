"""orthoserve.torch through shared-memory regions on its own (issue #28; orthoserve.region_transport), against real
servers started with --shm-socket: a Muon step with shm auto (and True) gives the same parameters bit for bit as with
shm off; the region is reused across steps and grows when a call needs more; without a usable region (no
--shm-socket, a socket that is not on this host, a uid the server refuses) auto sends bytes and says why, and True
raises; when the region's rank fails or forgets the region, no call returns a wrong result and the next steps use a
new region; Muon.step stays safe to call again after an error."""

import logging
import os
import threading

import pytest
import torch

import orthoserve
import orthoserve.torch as ot
from conftest import start_server
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc
from orthoserve.region_transport import RegionTransport, shm_mode

# The parameters of the Muon runs: fp32, bf16 and fp16 matrices and an N-d (conv) one.
SHAPES = [((64, 32), torch.float32), ((48, 80), torch.bfloat16), ((24, 24), torch.float16),
          ((8, 4, 3, 3), torch.float32)]


def shm_args(directory, name="shm.sock"):
    return ["--shm-socket", str(directory / name)]


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("shm-transport")
    s = start_server(d, shm_args(d), name="shm-transport")
    s.socket_path = d / "shm.sock"
    yield s
    s.stop()


def make_params(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen).to(dtype)) for shape, dtype in SHAPES]


def grads(params, step):
    gen = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=gen).to(p.dtype) for p in params]


def muon_step(opt, params, step):
    for p, g in zip(params, grads(params, step)):
        p.grad = g
    opt.step()


def bits(t):
    return t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(bits(x), bits(y))


def reference(address, steps, **muon_kwargs):
    """The parameters and momentum buffers after `steps` steps sent as bytes (shm off)."""
    params = make_params()
    with orthoserve.Client(address, timeout=60) as client:
        opt = ot.Muon(params, lr=0.05, client=client, shm=False, **muon_kwargs)
        for step in range(steps):
            muon_step(opt, params, step)
        assert opt.transport == "bytes" and opt.region_transport.shm_calls == 0
        return ([p.detach().clone() for p in params],
                [opt.state[p]["momentum_buffer"].clone() for p in params])


def regions_of(client, address):
    stub = pb_grpc.SharedMemoryStub(client.channels.channel(address))
    return list(stub.ListRegions(pb.ListRegionsRequest(), timeout=10,
                                 metadata=client.channels.metadata).regions)


@pytest.mark.deadline(180)
@pytest.mark.parametrize("flavor", ["eo", "torch"])
def test_muon_through_a_region_is_bit_identical_to_bytes(shm_server, flavor):
    expected, expected_buffers = reference(shm_server.address, 3, flavor=flavor)
    for mode in ("auto", True):
        params = make_params()
        with orthoserve.Client(shm_server.address, timeout=60) as client:
            opt = ot.Muon(params, lr=0.05, client=client, shm=mode, flavor=flavor)
            assert opt.transport is None
            ids = set()
            for step in range(3):
                muon_step(opt, params, step)
                assert opt.transport == "shm", opt.region_transport
                ids.add(opt.region_transport.region.id)
                # One region, reused by every step, and the only one this tenant holds.
                assert [r.region_id for r in regions_of(client, shm_server.address)] == list(ids)
            transport = opt.region_transport
            assert (transport.shm_calls, transport.bytes_calls, transport.reason) == (3, 0, "")
            # Every page was allocated by this process (Region.touch): charged to the trainer's memory cgroup.
            assert os.fstat(transport.region._fd).st_blocks * 512 >= transport.region.size
            assert transport.region.address == shm_server.address
            assert_same([p.detach() for p in params], expected)
            assert_same([opt.state[p]["momentum_buffer"] for p in params], expected_buffers)
        # Closing the client unregistered the region.
        with orthoserve.Client(shm_server.address, timeout=60) as other:
            assert regions_of(other, shm_server.address) == []


@pytest.mark.deadline(120)
def test_the_region_grows_when_a_call_needs_more(shm_server):
    gen = torch.Generator().manual_seed(5)
    small = torch.randn(32, 32, generator=gen)
    large = torch.randn(1024, 600, generator=gen)  # 2.4 MB in, 2.4 MB out: more than the first region's 1 MiB.
    with orthoserve.Client(shm_server.address, timeout=60) as client:
        ns = ot.RemoteNewtonSchulz(client=client, shm="auto", precision="highest")
        plain = ot.RemoteNewtonSchulz(client=client, shm=False, precision="highest")
        assert torch.equal(ns(small), plain(small))
        first = ns.region_transport.region
        assert ns.transport == "shm" and first.size == 1 << 20
        assert torch.equal(ns(large), plain(large))
        second = ns.region_transport.region
        assert ns.transport == "shm" and second.id != first.id and second.size >= 2 * 1024 * 600 * 4
        assert not first.id  # The outgrown region was unregistered...
        assert [r.region_id for r in regions_of(client, shm_server.address)] == [second.id]
        assert torch.equal(ns(small), plain(small))  # ...and the larger one serves smaller calls.
        assert ns.region_transport.region is second
        # A batch (3-D: nd_layout batch) and a bf16 matrix in one call.
        batch, half = torch.randn(3, 16, 24, generator=gen), torch.randn(40, 8, generator=gen).bfloat16()
        for a, b in zip(ns.batch([batch, half]), plain.batch([batch, half])):
            assert torch.equal(bits(a), bits(b))
        assert ns.region_transport.shm_calls == 4 and ns.region_transport.bytes_calls == 0


@pytest.mark.deadline(120)
def test_auto_sends_bytes_without_shm_socket_and_true_raises(server, caplog):
    expected, _ = reference(server.address, 2)
    params = make_params()
    with orthoserve.Client(server.address, timeout=60) as client:
        opt = ot.Muon(params, lr=0.05, client=client)  # shm defaults to auto.
        assert opt.region_transport.mode == "auto"
        with caplog.at_level(logging.INFO, logger="orthoserve"):
            for step in range(2):
                muon_step(opt, params, step)
        assert opt.transport == "bytes" and "--shm-socket" in opt.region_transport.reason
        said = [r for r in caplog.records if "go as bytes" in r.getMessage()]
        assert len(said) == 1 and said[0].levelno == logging.INFO and "--shm-socket" in said[0].getMessage()
        assert_same([p.detach() for p in params], expected)

        params = make_params()
        before = [p.detach().clone() for p in params]
        strict = ot.Muon(params, lr=0.05, client=client, shm=True)
        for _ in range(2):  # Raises every time, and changes nothing.
            for p, g in zip(params, grads(params, 0)):
                p.grad = g
            with pytest.raises(orthoserve.FailedPreconditionError, match="--shm-socket"):
                strict.step()
            assert_same([p.detach() for p in params], before)
            assert len(strict.state) == 0


@pytest.mark.deadline(120)
def test_auto_sends_bytes_when_the_socket_is_not_on_this_host(shm_server):
    moved = shm_server.socket_path.with_name("elsewhere.sock")
    x = torch.randn(16, 24, generator=torch.Generator().manual_seed(2))
    os.rename(shm_server.socket_path, moved)  # The path ServerInfo names is not here any more.
    try:
        with orthoserve.Client(shm_server.address, timeout=60) as client:
            ns = ot.RemoteNewtonSchulz(client=client, shm="auto")
            expected = ot.RemoteNewtonSchulz(client=client, shm=False)(x)
            assert torch.equal(ns(x), expected)
            assert ns.transport == "bytes" and "not a socket on this host" in ns.region_transport.reason
            with pytest.raises(orthoserve.FailedPreconditionError, match="not a socket on this host"):
                ot.RemoteNewtonSchulz(client=client, shm=True)(x)
    finally:
        os.rename(moved, shm_server.socket_path)


@pytest.mark.deadline(120)
def test_a_uid_the_server_refuses_means_bytes_or_an_error(tmp_path):
    s = start_server(tmp_path, shm_args(tmp_path) + ["--shm-peer-uids", str(os.getuid() + 1)], name="peer")
    try:
        x = torch.randn(16, 24, generator=torch.Generator().manual_seed(3))
        with orthoserve.Client(s.address, timeout=60) as client:
            ns = ot.RemoteNewtonSchulz(client=client)
            assert torch.equal(ns(x), ot.RemoteNewtonSchulz(client=client, shm=False)(x))
            assert ns.transport == "bytes"
            assert "PERMISSION_DENIED" in ns.region_transport.reason and "--shm-peer-uids" in ns.region_transport.reason
            with pytest.raises(orthoserve.PermissionDeniedError, match="--shm-peer-uids"):
                ot.RemoteNewtonSchulz(client=client, shm=True)(x)
    finally:
        s.stop()


@pytest.mark.deadline(60)
def test_no_memory_for_a_region_here_means_bytes_or_an_error(shm_server, monkeypatch):
    def no_memfd(*args, **kwargs):
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(orthoserve.shm.os, "memfd_create", no_memfd)
    x = torch.randn(16, 24, generator=torch.Generator().manual_seed(8))
    with orthoserve.Client(shm_server.address, timeout=60) as client:
        ns = ot.RemoteNewtonSchulz(client=client)
        assert torch.equal(ns(x), ot.RemoteNewtonSchulz(client=client, shm=False)(x))
        assert ns.transport == "bytes" and "could not be made here" in ns.region_transport.reason
        with pytest.raises(orthoserve.ResourceExhaustedError, match="Too many open files"):
            ot.RemoteNewtonSchulz(client=client, shm=True)(x)


@pytest.mark.deadline(240)
@pytest.mark.parametrize("mode", ["auto", True])
def test_the_regions_rank_failing_never_gives_a_wrong_result(tmp_path, mode):
    a = start_server(tmp_path, shm_args(tmp_path, "a.sock"), name="a")
    b = start_server(tmp_path, shm_args(tmp_path, "b.sock"), name="b")
    try:
        expected, expected_buffers = reference(b.address, 4)
        params = make_params()
        retry = orthoserve.RetryPolicy(deadline=30, max_backoff=0.5)
        with orthoserve.Client([a.address, b.address], timeout=20, retry=retry) as client:
            opt = ot.Muon(params, lr=0.05, client=client, shm=mode)
            transport = opt.region_transport
            muon_step(opt, params, 0)
            assert opt.transport == "shm" and transport.region.address == a.address
            a.stop()  # The region's rank goes away.
            muon_step(opt, params, 1)
            if mode == "auto":
                # Sent again as bytes (to b), saying why; the next step registers a region on b.
                assert opt.transport == "bytes" and a.address in transport.reason
                assert transport.region is None
                muon_step(opt, params, 2)
                assert opt.transport == "shm" and transport.region.address == b.address
                assert transport.bytes_calls == 1
            else:
                # Retried through a new region on b within the same step; never bytes.
                assert opt.transport == "shm" and transport.region.address == b.address
                assert transport.bytes_calls == 0
                muon_step(opt, params, 2)
            muon_step(opt, params, 3)
            assert_same([p.detach() for p in params], expected)
            assert_same([opt.state[p]["momentum_buffer"] for p in params], expected_buffers)
    finally:
        a.stop()
        b.stop()


@pytest.mark.deadline(180)
@pytest.mark.parametrize("mode", ["auto", True])
def test_a_region_the_server_forgot_is_replaced(shm_server, mode):
    expected, _ = reference(shm_server.address, 3)
    params = make_params()
    with orthoserve.Client(shm_server.address, timeout=60) as client:
        opt = ot.Muon(params, lr=0.05, client=client, shm=mode)
        muon_step(opt, params, 0)
        old = opt.region_transport.region
        # The server drops it (as a restarted server at the same address would not know it); the client's object
        # still names it.
        stub = pb_grpc.SharedMemoryStub(client.channels.channel(shm_server.address))
        stub.UnregisterRegion(pb.UnregisterRegionRequest(region_id=old.id), timeout=10,
                              metadata=client.channels.metadata)
        muon_step(opt, params, 1)
        if mode == "auto":
            assert opt.transport == "bytes" and "NOT_FOUND" in opt.region_transport.reason
            muon_step(opt, params, 2)
        else:
            assert opt.transport == "shm" and opt.region_transport.bytes_calls == 0
            muon_step(opt, params, 2)
        new = opt.region_transport.region
        assert opt.transport == "shm" and new.id and new.id != old.id and not old.id
        assert_same([p.detach() for p in params], expected)


@pytest.mark.deadline(180)
def test_muon_step_again_after_an_error_is_one_step(tmp_path):
    a = start_server(tmp_path, shm_args(tmp_path, "a.sock"), name="a")
    b = start_server(tmp_path, shm_args(tmp_path, "b.sock"), name="b")
    try:
        expected, expected_buffers = reference(b.address, 2)
        params = make_params()
        clients = [orthoserve.Client(a.address, timeout=20, retry=False), orthoserve.Client(b.address, timeout=20)]
        ot.set_default_client(clients[0])
        opt = ot.Muon(params, lr=0.05)  # The default client at each step; shm auto.
        muon_step(opt, params, 0)
        assert opt.transport == "shm"
        after_one = [p.detach().clone() for p in params]
        buffers = [opt.state[p]["momentum_buffer"].clone() for p in params]
        a.stop()
        for p, g in zip(params, grads(params, 1)):
            p.grad = g
        with pytest.raises(orthoserve.UnavailableError):
            opt.step()  # Through the region, then as bytes: both fail.
        assert opt.region_transport.region is None  # The failed call's region is never used again.
        assert_same([p.detach() for p in params], after_one)
        assert_same([opt.state[p]["momentum_buffer"] for p in params], buffers)
        ot.set_default_client(clients[1])
        opt.step()  # The same gradients: the step that failed, once.
        assert opt.transport == "shm" and opt.region_transport.region.address == b.address
        assert_same([p.detach() for p in params], expected)
        assert_same([opt.state[p]["momentum_buffer"] for p in params], expected_buffers)
    finally:
        ot.set_default_client(None)
        for c in clients:
            c.close()
        a.stop()
        b.stop()


@pytest.mark.deadline(120)
def test_newton_schulz_uses_the_default_clients_region(shm_server, monkeypatch):
    x = torch.randn(3, 40, 24, generator=torch.Generator().manual_seed(4))
    try:
        client = orthoserve.Client(shm_server.address, timeout=60)
        ot.set_default_client(client)
        got = ot.newton_schulz(x, 5)
        assert ot.region_transport().transport == "shm" and ot.region_transport(client).shm_calls == 1
        monkeypatch.setenv("ORTHOSERVE_SHM", "off")  # Read when a client's transport is made.
        other = orthoserve.Client(shm_server.address, timeout=60)
        ot.set_default_client(other)
        assert torch.equal(ot.newton_schulz(x, 5), got)
        assert ot.region_transport().transport == "bytes" and ot.region_transport().mode == "off"
        assert ot.region_transport(client).shm_calls == 1
    finally:
        ot.set_default_client(None)
    monkeypatch.setenv("ORTHOSERVE_SHM", "sometimes")
    with pytest.raises(ValueError, match="ORTHOSERVE_SHM"):
        ot.Muon(make_params(), client=client)
    with pytest.raises(ValueError, match="shm must be"):
        ot.RemoteNewtonSchulz(client=client, shm="maybe")
    assert [shm_mode(v) for v in ("auto", True, "on", "1", False, "off", "no")] == \
        ["auto", "on", "on", "on", "off", "off", "off"]
    client.close()
    other.close()


@pytest.mark.deadline(180)
def test_concurrent_calls_share_the_region_safely(shm_server):
    gen = torch.Generator().manual_seed(6)
    inputs = [torch.randn(48 + 8 * i, 40, generator=gen) for i in range(12)]
    with orthoserve.Client(shm_server.address, timeout=60) as client:
        expected = ot.RemoteNewtonSchulz(client=client, shm=False).batch(inputs)
        ns = ot.RemoteNewtonSchulz(client=client, shm="auto")
        got = [None] * len(inputs)
        failures = []

        def work(k):
            try:
                for i in range(k, len(inputs), 4):
                    got[i] = ns(inputs[i])
            except Exception as e:  # noqa: BLE001 - reported below
                failures.append(e)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not failures, failures
        for a, b in zip(got, expected):
            assert torch.equal(a, b)
        transport = ns.region_transport
        assert transport.shm_calls + transport.bytes_calls == len(inputs) and transport.shm_calls >= 1


@pytest.mark.deadline(10)
def test_the_transport_is_plain_python_without_a_server():
    t = RegionTransport(False)
    assert (t.mode, t.transport, t.region) == ("off", None, None)
    t.close()  # Nothing to close.
    assert "mode='off'" in repr(t)
    with pytest.raises(ValueError, match="shm must be"):
        RegionTransport("sometimes")
