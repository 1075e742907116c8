"""Group steps through shared-memory regions (issue #28, docs/shared_memory.md) on a two-member fleet of real
server processes, each with its own --shm-socket: W = 4 trainer ranks (threads, one Client each) stream their
blocks to the members by the usual routing, some with inputs and results in a region registered on their member,
some with bytes, some mixed; every rank's results are bit-identical to the same step in bytes. A region array
pins the step to its region's member."""

import uuid

import numpy as np
import pytest

import orthoserve
from conftest import on_every_rank

WORLD = 4
SHAPES = [((24, 16), np.float32), ((16, 12), np.float16)]


@pytest.mark.deadline(240)
def test_a_group_step_through_regions_has_the_bits_of_bytes(shm_fleet):
    addresses = [s.address for s in shm_fleet]
    rng = np.random.default_rng(28)
    fulls = [rng.standard_normal(shape).astype(dtype) for shape, dtype in SHAPES]
    blocks = [orthoserve.chunk_blocks(shape, WORLD, 0) for shape, _ in SHAPES]
    run_id = uuid.uuid4().hex
    # How each trainer rank holds its blocks of step 2: (input in a region, result in a region) per matrix.
    ways = {0: [(True, True), (True, True)], 1: [(True, False), (False, True)], 2: [(False, True), (True, False)],
            3: [(False, False), (False, False)]}

    def shard(i, rank, data):
        (r0, c0), _ = blocks[i][rank]
        return orthoserve.Shard(f"w{i}", SHAPES[i][0], (r0, c0), data, precision="highest")

    def block_of(i, rank):
        (r0, c0), (rows, cols) = blocks[i][rank]
        return fulls[i][r0:r0 + rows, c0:c0 + cols]

    def rank_main(rank):
        with orthoserve.Client(addresses, timeout=60) as client:
            group = client.group("shm-job", "g", rank, WORLD, run_id=run_id)
            expected = group.step(1, [shard(i, rank, np.ascontiguousarray(block_of(i, rank))) for i in range(2)])
            member = group.address
            with client.region(1 << 20, address=member) as region:
                shards, outs = [], []
                for i, (in_region, out_region) in enumerate(ways[rank]):
                    block = block_of(i, rank)
                    data = np.ascontiguousarray(block)
                    if in_region:
                        data = region.array(block.shape, block.dtype)
                        data[...] = block
                    shards.append(shard(i, rank, data))
                    outs.append(region.array(block.shape, block.dtype) if out_region else None)
                got = group.step(2, shards, out=outs)
                assert group.address == member  # Pinned to its region's member (routing picked it too).
                for i, (g, e, o) in enumerate(zip(got, expected, outs)):
                    if o is not None:
                        assert g is o, f"rank {rank} matrix {i}: the result is not the out array"
                    assert g.dtype == e.dtype and g.shape == e.shape
                    assert g.tobytes() == e.tobytes(), f"rank {rank} matrix {i} differs from bytes"
        return member

    members = on_every_rank(WORLD, rank_main)
    assert set(members) == set(addresses), "the trainer ranks did not spread over both members"


@pytest.mark.deadline(120)
def test_region_arrays_of_two_members_in_one_step_are_refused(shm_fleet):
    addresses = [s.address for s in shm_fleet]
    with orthoserve.Client(addresses, timeout=30) as client:
        with client.region(1 << 16, address=addresses[0]) as r0, client.region(1 << 16, address=addresses[1]) as r1:
            a, b = r0.array((4, 8), np.float32), r1.array((4, 8), np.float32)
            group = client.group("shm-job", "two", 0, 2, run_id=uuid.uuid4().hex)
            with pytest.raises(ValueError, match="one call goes to one server rank"):
                group.step(1, [orthoserve.Shard("a", (8, 8), (0, 0), a), orthoserve.Shard("b", (8, 8), (0, 0), b)])
            with pytest.raises(ValueError, match="not an array of one of this client's open regions"):
                group.step(1, [orthoserve.Shard("a", (8, 8), (0, 0), a)], out=[np.zeros((4, 8), np.float32)])


@pytest.mark.deadline(120)
def test_two_ranks_naming_one_result_slice_are_both_refused_and_nothing_is_written(shm_fleet):
    # Trainer ranks 0 and 1 of one step name the same region array as `out` (one client, one region): the fleet
    # refuses the step on both ranks before it runs, so the array keeps what the caller put there (an answer that
    # held the other rank's block would be a wrong answer with no error).
    addresses = [s.address for s in shm_fleet]
    rng = np.random.default_rng(38)
    full = rng.standard_normal((8, 8)).astype(np.float32)
    run_id = uuid.uuid4().hex
    with orthoserve.Client(addresses, timeout=30, retry=False) as client:
        with client.region(1 << 16, address=addresses[0]) as region:
            shared_out = region.array((4, 8), np.float32)
            shared_out[...] = -7.0

            def rank_main(rank):
                group = client.group("shm-job", "one-out", rank, 2, run_id=run_id)
                shard = orthoserve.Shard("w", (8, 8), (4 * rank, 0), np.ascontiguousarray(full[4 * rank:4 * rank + 4]))
                with pytest.raises(orthoserve.InvalidArgumentError, match="overlaps") as caught:
                    group.step(1, [shard], out=[shared_out])
                return str(caught.value)

            messages = on_every_rank(2, rank_main)
            assert all("trainer rank" in m for m in messages), messages
            assert np.all(shared_out == -7.0), "a refused step wrote into the shared out array"
