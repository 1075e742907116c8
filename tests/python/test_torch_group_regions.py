"""orthoserve.torch's group steps through shared-memory regions (issue #28; orthoserve.region_transport, "Group
steps"): 4 torch.distributed (gloo) trainer ranks, as processes, train sharded DTensor parameters with the remote Muon
against a two-member fleet of real servers, each with its own --shm-socket.

- Through regions (shm auto) every rank's updates are bit for bit those of the same steps sent as bytes (shm off),
  with one region per member a rank's group steps go to (ranks 1 and 2 of a 2 x 2 mesh use both members), reused
  from step to step; newton_schulz(tp_group=...) likewise.
- A group step whose attempt through its region fails (here: its answer lost after the step ran) is sent again with
  the next attempt number, re-routed to the other member — as bytes (auto), or through a new region there (True) —
  and answered there by a replay of the step that ran, with the right bits; the next step registers a new region.
  A region the member dropped between two steps is found before the step names it and replaced.
- shm off sends bytes; auto without --shm-socket sends bytes and says why; shm=True raises FailedPreconditionError
  and changes nothing.
"""

import time
import uuid

import pytest
import torch

from dist_util import run_ranks

STEPS = 3
KW = dict(lr=0.05, momentum=0.9, weight_decay=0.01, fp32_matmul_prec="highest")


# -- in the trainer ranks ----------------------------------------------------------------------------------------

def _setup():
    import typing

    import typing_extensions

    typing.override = getattr(typing, "override", typing_extensions.override)  # EO on Python 3.11


def _bits(t):
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _assert_same(got, expected, what):
    for i, (a, b) in enumerate(zip(got, expected)):
        assert torch.equal(_bits(a), _bits(b)), f"{what}: parameter {i} differs from bytes"


def _params(mesh, layouts):
    """Parameters, the same values on every rank: (shape, dtype, placements or None for a plain tensor, tp_mode)."""
    from torch.distributed.tensor import distribute_tensor

    g = torch.Generator().manual_seed(0)
    params = []
    for shape, dtype, placements, tp_mode in layouts:
        full = torch.randn(shape, generator=g).to(dtype)
        p = torch.nn.Parameter(full if placements is None else distribute_tensor(full, mesh, placements))
        if tp_mode is not None:
            p.tp_mode = tp_mode
        params.append(p)
    return params


def _set_grads(params, mesh, step):
    from torch.distributed.tensor import distribute_tensor

    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        full = torch.randn(p.shape, generator=g).to(p.dtype)
        p.grad = distribute_tensor(full, mesh, p.placements) if hasattr(p, "placements") else full


def _train(client, mesh, layouts, job, steps=STEPS, before_step=None, **muon_kwargs):
    """(the parameters after each step, the optimizer) of `steps` Muon steps."""
    from orthoserve.torch import Muon

    params = _params(mesh, layouts)
    opt = Muon(params, client=client, job=job, **KW, **muon_kwargs)
    history = []
    for step in range(steps):
        if before_step is not None:
            before_step(step, opt)
        _set_grads(params, mesh, step)
        opt.step()
        history.append([p.detach().clone() for p in params])
    return history, opt


def _bits_rank(rank, world, addresses, run):
    _setup()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard

    import orthoserve
    import orthoserve.torch as ot

    mesh = init_device_mesh("cpu", (2, 2))
    # Group steps over mesh dim 0 (groups of ranks {0, 2} and {1, 3}) and over mesh dim 1 ({0, 1}, {2, 3}), and a
    # plain tensor sent whole (through the lone region).
    layouts = [((16, 12), torch.float32, [Shard(0), Replicate()], None),
               ((12, 20), torch.bfloat16, [Replicate(), Shard(1)], "duplicated"),
               ((10, 6, 3), torch.float16, [Shard(0), Replicate()], None),
               ((8, 6), torch.float32, None, None)]
    with orthoserve.Client(addresses, timeout=60) as client:
        expected, off = _train(client, mesh, layouts, f"off-{run}", shm=False)
        assert off.transport == "bytes" and off.region_transport.group_regions == {}
        ids = []
        got, opt = _train(client, mesh, layouts, f"shm-{run}", shm="auto",
                          before_step=lambda step, o: ids.append({a: r.id for a, r in
                                                                  o.region_transport.group_regions.items()}))
        transport = opt.region_transport
        for step in range(STEPS):
            _assert_same(got[step], expected[step], f"rank {rank} step {step}")
        assert opt.transport == "shm" and transport.reason == "", transport
        # Each step: one lone call and two group steps, all through regions.
        assert (transport.shm_calls, transport.bytes_calls) == (3 * STEPS, 0), transport
        # One region on each member this rank's groups go to (mesh coordinates (rank // 2, rank % 2), each group's
        # rank the coordinate on its dim: group rank 0 goes to member 0, 1 to member 1), the same at every step.
        members = {addresses[rank // 2], addresses[rank % 2]}
        regions = transport.group_regions
        assert set(regions) == members and all(r.address == a for a, r in regions.items()), regions
        assert ids[1] == ids[2] == {a: r.id for a, r in regions.items()}, ids
        assert transport.region.address == addresses[0]  # The lone calls' region, on the first address.

        # newton_schulz(tp_group=...) (its transport: the default client's, with shm=$ORTHOSERVE_SHM).
        import os

        import torch.distributed as dist

        x = torch.randn(12, 40, generator=torch.Generator().manual_seed(7))
        local = x.chunk(world, dim=1)[rank]
        results = {}
        for mode in ("off", "on"):
            os.environ["ORTHOSERVE_SHM"] = mode
            with orthoserve.Client(addresses, timeout=60) as tp_client:
                ot.set_default_client(tp_client)
                try:
                    results[mode] = ot.newton_schulz(local, 5, tp_group=dist.group.WORLD)
                    assert ot.region_transport().transport == ("shm" if mode == "on" else "bytes")
                finally:
                    ot.set_default_client(None)
        assert torch.equal(results["on"], results["off"])


def _fallback_rank(rank, world, addresses, run, mode):
    _setup()
    import grpc
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard

    import orthoserve
    from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
    from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc

    mesh = init_device_mesh("cpu", (world,))
    # One group of the 4 ranks (ranks 0, 1 stream to member 0; 2, 3 to member 1).
    layouts = [((16, 12), torch.float32, [Shard(0)], None), ((12, 20), torch.bfloat16, [Shard(1)], "duplicated")]
    retry = orthoserve.RetryPolicy(deadline=60, max_backoff=0.5)
    with orthoserve.Client(addresses, timeout=30, retry=retry) as client:
        expected, _ = _train(client, mesh, layouts, f"off-{run}", shm=False)
        sent = []  # (step, attempt, through a region, member) of every group-step stream of this rank.
        stream = client._stream

        def lossy_stream(address, header, entries, timeout):
            in_region = any(e.spec.HasField("input_region") for e in entries)
            sent.append((header.step, header.attempt, in_region, address))
            results = stream(address, header, entries, timeout)
            if rank == 2 and (header.step, header.attempt) == (1, 0) and in_region:
                # The step ran, but its answer does not arrive (as when a member dies after the batch): a
                # retryable failure of the attempt through the region. Its results were written into the region.
                raise orthoserve.UnavailableError(grpc.StatusCode.UNAVAILABLE, "injected: the answer was lost")
            return results

        client._stream = lossy_stream
        seen = {}

        def before_step(step, opt):
            transport = opt.region_transport
            if step == 2 and rank == 2:
                # After the failure the step went, as attempt 1, to the other member: as bytes (auto), or through a
                # new region there (True). The failed attempt's region is gone.
                assert [s for s in sent if s[0] == 1] == [(1, 0, True, addresses[1]),
                                                          (1, 1, mode is True, addresses[0])], sent
                assert not seen["region"].id and addresses[1] not in transport.group_regions
                if mode == "auto":
                    assert opt.transport == "bytes" and "UNAVAILABLE" in transport.reason, transport
                    assert "attempt 1" in transport.reason and transport.group_regions == {}
                else:
                    assert opt.transport == "shm" and set(transport.group_regions) == {addresses[0]}
            if step == 2 and rank == 3:
                # The member drops this rank's region (as a restarted member would not know it): found before step
                # 2 names it, and replaced.
                region = transport.group_regions[addresses[1]]
                stub = pb_grpc.SharedMemoryStub(client.channels.channel(region.address))
                stub.UnregisterRegion(pb.UnregisterRegionRequest(region_id=region.id), timeout=10,
                                      metadata=client.channels.metadata)
                deadline = time.monotonic() + 10
                while not region.dropped() and time.monotonic() < deadline:  # The member ends its lifeline.
                    time.sleep(0.05)
                assert region.dropped()
            if step == 1:
                seen["region"] = transport.group_regions[addresses[rank // 2]]

        got, opt = _train(client, mesh, layouts, f"shm-{run}", shm=mode, before_step=before_step)
        transport = opt.region_transport
        for step in range(STEPS):
            _assert_same(got[step], expected[step], f"rank {rank} step {step}")
        # Step 2 went through a region again: a new one where the old one was dropped.
        assert opt.transport == "shm", transport
        region = transport.group_regions[addresses[rank // 2]]
        assert (region.id != seen["region"].id) == (rank in (2, 3)), (rank, region, seen)
        auto_fell_back = rank == 2 and mode == "auto"
        assert (transport.shm_calls, transport.bytes_calls) == ((STEPS - 1, 1) if auto_fell_back else (STEPS, 0))
        # The attempts of each step are numbered 0, 1, ... whichever way each went.
        for step in range(STEPS):
            numbers = [attempt for s, attempt, _, _ in sent if s == step]
            assert numbers == list(range(len(numbers))), sent


def _modes_rank(rank, world, address, run):
    _setup()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard

    import orthoserve

    mesh = init_device_mesh("cpu", (world,))
    layouts = [((16, 12), torch.float32, [Shard(0)], None), ((12, 20), torch.bfloat16, [Shard(1)], "duplicated")]
    with orthoserve.Client(address, timeout=60) as client:
        expected, off = _train(client, mesh, layouts, f"off-{run}", steps=2, shm=False)
        assert off.transport == "bytes" and off.region_transport.reason == "shm is off"
        assert off.region_transport.group_regions == {} and off.region_transport.shm_calls == 0
        got, auto = _train(client, mesh, layouts, f"auto-{run}", steps=2, shm="auto")
        assert auto.transport == "bytes" and "--shm-socket" in auto.region_transport.reason, auto.region_transport
        assert auto.region_transport.group_regions == {}
        for step in range(2):
            _assert_same(got[step], expected[step], f"rank {rank} step {step}")

        from orthoserve.torch import Muon

        params = _params(mesh, layouts)
        before = [p.detach().clone() for p in params]
        strict = Muon(params, client=client, job=f"on-{run}", shm=True, **KW)
        _set_grads(params, mesh, 0)
        for _ in range(2):  # Raises every time, before any rank sends, and changes nothing.
            with pytest.raises(orthoserve.FailedPreconditionError, match="--shm-socket"):
                strict.step()
            _assert_same([p.detach() for p in params], before, f"rank {rank} after the error")
            assert len(strict.state) == 0 and strict.transport is None


# -- the tests ---------------------------------------------------------------------------------------------------

@pytest.mark.deadline(300)
def test_muon_group_steps_through_regions_have_the_bits_of_bytes(shm_fleet):
    run_ranks(4, _bits_rank, [s.address for s in shm_fleet], uuid.uuid4().hex, timeout=10)


@pytest.mark.deadline(300)
@pytest.mark.parametrize("mode", ["auto", True])
def test_a_failed_attempt_through_a_region_is_retried_with_the_next_attempt_number(shm_fleet, mode):
    """auto: the retry goes as bytes; True: through a new region on the member it is re-routed to."""
    run_ranks(4, _fallback_rank, [s.address for s in shm_fleet], uuid.uuid4().hex, mode, timeout=10)


@pytest.mark.deadline(240)
def test_off_sends_bytes_and_on_without_shm_socket_raises(server):
    run_ranks(2, _modes_rank, server.address, uuid.uuid4().hex, timeout=10)
