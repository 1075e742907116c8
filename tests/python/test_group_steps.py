"""Group steps through the real server: W trainer ranks (threads) each send their block of the same matrices;
the assembled results of the exact algorithms equal Emerging-Optimizers' whole-matrix computation and each
other bit for bit, TP_DISTRIBUTED agrees within fp32 tolerance, TP_BLOCKWISE is each block alone; a missing
rank aborts the step with ABORTED naming it. Each group step is one run's (a run id drawn per step)."""

import uuid

import grpc
import pytest
import torch

import orthoserve
import oracle
from conftest import on_every_rank, start_fleet, start_server

SHAPE = (20, 14)


def full_matrix(seed=0, shape=SHAPE):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def run_group(client, world, dim, algorithm, step, job="group-test", partition_dim=None, name="w", shape=SHAPE):
    """Every rank's step in its own thread; returns the assembled result."""
    full = full_matrix(shape=shape)
    blocks = orthoserve.chunk_blocks(shape, world, dim)
    run_id = uuid.uuid4().hex  # Shared by this step's trainer ranks.

    def rank_main(rank):
        (r0, c0), (rows, cols) = blocks[rank]
        shard = orthoserve.Shard(name, shape, (r0, c0), full[r0:r0 + rows, c0:c0 + cols].clone(),
                                 algorithm=algorithm, partition_dim=partition_dim, precision="highest")
        [result] = client.group(job, f"{algorithm}-{dim}-{world}", rank, world, run_id=run_id).step(step, [shard])
        return result

    results = on_every_rank(world, rank_main)
    out = torch.empty(shape)
    for ((r0, c0), (rows, cols)), block in zip(blocks, results):
        assert block.shape == (rows, cols)
        out[r0:r0 + rows, c0:c0 + cols] = block
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_exact_algorithms_match_the_whole_matrix(client, world):
    ref = oracle.scaled(full_matrix(), "spectral")
    outs = [run_group(client, world, 0, "auto", 1), run_group(client, world, 0, "row_sharded", 2),
            run_group(client, world, 1, "gathered", 3), run_group(client, world, 1, "tp_duplicated", 4,
                                                                   partition_dim=1)]
    for out in outs:
        assert (out - ref).abs().max().item() <= 1e-5
        assert torch.equal(out, outs[0])


@pytest.mark.parametrize("algorithm", ["auto", "row_sharded", "gathered"])
def test_ranks_with_empty_blocks_take_part(client, algorithm):
    # 3 rows over 4 ranks: torch.chunk gives rank 3 no rows; it still sends its (empty) block.
    shape = (3, 10)
    out = run_group(client, 4, 0, algorithm, 7, shape=shape, job=f"empty-{algorithm}")
    assert (out - oracle.scaled(full_matrix(shape=shape), "spectral")).abs().max().item() <= 1e-5


@pytest.mark.parametrize("dim", [0, 1])
def test_tp_distributed_agrees(client, dim):
    ref = oracle.scaled(full_matrix(), "spectral")
    out = run_group(client, 2, dim, "tp_distributed", 5, partition_dim=dim)
    assert (out - ref).abs().max().item() <= 1e-4


def test_tp_blockwise_is_each_block_alone(client):
    out = run_group(client, 2, 0, "tp_blockwise", 6, partition_dim=0)
    full = full_matrix()
    for (r0, c0), (rows, cols) in orthoserve.chunk_blocks(SHAPE, 2, 0):
        block_ref = oracle.scaled(full[r0:r0 + rows, c0:c0 + cols], "spectral")
        assert (out[r0:r0 + rows, c0:c0 + cols] - block_ref).abs().max().item() <= 1e-5


def test_missing_rank_aborts_the_step(tmp_path):
    server = start_server(tmp_path, ["--rendezvous-timeout", "2s"], name="rendezvous")
    try:
        full = full_matrix()
        with orthoserve.Client(server.address, timeout=60) as client:
            shard = orthoserve.Shard("w", SHAPE, (0, 0), full[:10].clone())
            with pytest.raises(orthoserve.AbortedError) as err:
                client.group("job", "lonely", 0, 2, run_id="lonely-run").step(1, [shard])
        assert err.value.code == grpc.StatusCode.ABORTED
        assert "trainer ranks [1] of 2" in err.value.message, err.value.message
    finally:
        server.stop()


def test_fleet_group_steps_are_exact(fleet2):
    """W = 4 trainer ranks on a 2-rank fleet (ranks 0,1 -> fleet 0; 2,3 -> fleet 1)."""
    with orthoserve.Client(fleet2[0].address, timeout=60) as client:
        assert [client.group("j", "g", r, 4, run_id="routing").address for r in range(4)] == [fleet2[0].address] * 2 + [
            fleet2[1].address] * 2
        ref = oracle.scaled(full_matrix(), "spectral")
        a = run_group(client, 4, 0, "auto", 1, job="fleet-groups")
        b = run_group(client, 4, 0, "row_sharded", 2, job="fleet-groups")
        c = run_group(client, 4, 1, "tp_duplicated", 3, job="fleet-groups", partition_dim=1)
        for out in (a, b, c):
            assert (out - ref).abs().max().item() <= 1e-5
        assert torch.equal(a, b) and torch.equal(a, c)


MULTI = [("auto", None), ("row_sharded", None), ("gathered", None), ("tp_duplicated", 0), ("tp_distributed", 0)]


def run_multi_step(client, step, job):
    """One W = 2 group step of five 20x14 matrices, one per algorithm (row blocks); the assembled results."""
    fulls = [full_matrix(seed=10 + i) for i in range(len(MULTI))]
    blocks = orthoserve.chunk_blocks(SHAPE, 2, 0)
    run_id = uuid.uuid4().hex

    def rank_main(rank):
        (r0, c0), (rows, cols) = blocks[rank]
        shards = [orthoserve.Shard(f"w{i}", SHAPE, (r0, c0), full[r0:r0 + rows, c0:c0 + cols].clone(),
                                   algorithm=algorithm, partition_dim=pdim, precision="highest")
                  for i, (full, (algorithm, pdim)) in enumerate(zip(fulls, MULTI))]
        return client.group(job, "multi", rank, 2, run_id=run_id).step(step, shards)

    results = on_every_rank(2, rank_main)
    outs = []
    for i in range(len(MULTI)):
        out = torch.empty(SHAPE)
        for ((r0, c0), (rows, cols)), rank_results in zip(blocks, results):
            out[r0:r0 + rows, c0:c0 + cols] = rank_results[i]
        outs.append(out)
    return fulls, outs


def test_a_step_divided_into_parts_has_the_bits_of_the_whole_step(tmp_path):
    """The real binaries on two 2-rank fleets: one appends group steps whole (--fleet-batch-part-time=0), the
    other in parts of one matrix per member (a part time of 1ns; once the coordinator has seen the generation
    formed, so the second step at the latest), which cross the fleet's wire as parts. Every matrix, of every
    algorithm, has the same bits either way."""
    outs = {}
    for part_time in ("0", "1ns"):
        (tmp_path / f"fleet-{part_time}").mkdir()
        flags = ("--fleet-batch-part-time", part_time, "--log-verbose", "fleet=1")
        ranks = start_fleet(tmp_path / f"fleet-{part_time}", 2, extra_args=flags)
        try:
            with orthoserve.Client(ranks[0].address, timeout=60) as client:
                for step in (1, 2):  # The second step is paced, so divided on the 1ns fleet.
                    fulls, outs[(part_time, step)] = run_multi_step(client, step, job="parts")
        finally:
            for s in reversed(ranks):
                s.stop()
        # The coordinator's log (rank 0, --log-verbose fleet=1) shows the parts of step 2: 2 + 2 + 1 matrices.
        log = ranks[0].log_path.read_text(errors="replace")
        parts = [line for line in log.splitlines() if "parts/multi@2" in line and " part: " in line]
        if part_time == "0":
            assert not parts, parts
        else:
            assert [p.split(" part: ")[1] for p in parts] == ["matrices 0..1, more follow", "matrices 2..3, more follow",
                                                              "matrices 4..4, the last"], parts
    for step in (1, 2):
        for i, (algorithm, _) in enumerate(MULTI):
            assert torch.equal(outs[("1ns", step)][i], outs[("0", step)][i]), (algorithm, step)
            tolerance = 1e-4 if algorithm == "tp_distributed" else 1e-5
            ref = oracle.scaled(fulls[i], "spectral")
            assert (outs[("1ns", step)][i] - ref).abs().max().item() <= tolerance, algorithm
