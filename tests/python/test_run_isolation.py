"""Two runs of one tenant never get each other's results (issue 24, "Done when"), on one server and on a 3-rank fleet:

- two runs, W = 2 each, with the same job, group, step and matrix names, as separate processes launched with
  different TORCHELASTIC_RUN_IDs, arriving interleaved (A0, B0, A1, B1): every answer is the caller's own correct
  result (its block of its own run's matrix, against a float64 reference of the same Newton–Schulz loop) or a clear
  error (FAILED_PRECONDITION or ABORTED with a message), and at least one run succeeds;
- two 2-process gloo runs of an FSDP-style step (a 256x128 DTensor Shard(0) weight, orthoserve.torch.Muon(params,
  lr=0.02) with every other argument default), one rank of each run 1.5 s late: each run's updated weight is bit for
  bit the same run's alone (Muon's default job is one per run, so the runs never meet on a step);
- a new run's retry (attempt 1) of a step another run finished, and a retry of the same run with other blocks: never
  answered from the other run's (or the original's) kept blocks.

The servers run with a short --rendezvous-timeout, so a refused run's partner fails fast (ABORTED). Where the fleet
refuses the later of two runs that meet on a step, that run gets FAILED_PRECONDITION; where it keeps them apart by
run id only, both succeed: both are right. A wrong answer always fails the test.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import time
import uuid
from typing import Dict, List, Optional, Tuple

import grpc
import numpy as np
import pytest
import torch

import orthoserve
import oracle
from conftest import start_fleet, start_server
from dist_util import run_launches
from isolation_rank import OPTIONS, SHAPE, run_matrix
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb
from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc

HERE = pathlib.Path(__file__).resolve().parent
RENDEZVOUS_TIMEOUT_S = 4
# fp32 HIGHEST against float64: ~1e-6 relative; two runs' blocks mixed into one matrix: ~0.4.
TOLERANCE = 1e-4
# A clear error: the fleet refused the run (FAILED_PRECONDITION naming both runs) or its step could not complete
# (ABORTED: a partner refused, a retry's blocks differ from the kept ones).
CLEAR_ERRORS = {"FAILED_PRECONDITION", "ABORTED"}
WORLD = 2

pytestmark = pytest.mark.deadline(90)


@pytest.fixture(scope="module", params=["one server", "3-rank fleet"])
def target(request, tmp_path_factory) -> List:
    """A one-rank server or a 3-rank fleet (trainer rank 0 of 2 -> member 0, rank 1 -> member 1), both with a
    rendezvous timeout of RENDEZVOUS_TIMEOUT_S; its processes by rank."""
    flags = ("--rendezvous-timeout", f"{RENDEZVOUS_TIMEOUT_S}s")
    tmp = tmp_path_factory.mktemp("isolation")
    ranks = [start_server(tmp, flags)] if request.param == "one server" else start_fleet(tmp, 3, extra_args=flags)
    try:
        with orthoserve.Client(ranks[0].address) as client:
            assert client.info().limits.rendezvous_timeout_seconds == RENDEZVOUS_TIMEOUT_S
        yield ranks
    finally:
        for s in reversed(ranks):
            s.stop()


def reference_block(seed: int, rank: int) -> np.ndarray:
    """Trainer rank `rank`'s block of the float64 NS of run `seed`'s matrix."""
    (r0, c0), (rows, cols) = orthoserve.chunk_blocks(SHAPE, WORLD, 0)[rank]
    return oracle.newton_schulz_float64(run_matrix(seed))[r0:r0 + rows, c0:c0 + cols]


def check_answer(what: str, outcome: Dict, got: Optional[np.ndarray], seed: int, rank: int) -> bool:
    """Asserts that `outcome` is rank `rank` of run `seed`'s own correct block, or a clear error; True if a result."""
    if outcome["ok"]:
        assert got is not None, f"{what}: no result"
        error = oracle.relative_error(got, reference_block(seed, rank))
        assert error <= TOLERANCE, f"{what}: a WRONG result (relative error {error:.3g} against its own reference)"
        return True
    assert outcome["code"] in CLEAR_ERRORS and outcome["message"], f"{what}: not a clear error: {outcome}"
    return False


# -- two runs as separate processes, interleaved -----------------------------------------------------------

def test_two_launched_runs_interleaved_get_their_own_results_or_a_clear_error(target, tmp_path):
    runs = {"A": (f"elastic-A-{uuid.uuid4().hex[:8]}", 101), "B": (f"elastic-B-{uuid.uuid4().hex[:8]}", 202)}
    order = ["A0", "B0", "A1", "B1"]
    procs: Dict[str, subprocess.Popen] = {}
    logs = {}
    try:
        for label in order:
            run_id, seed = runs[label[0]]
            env = {k: v for k, v in os.environ.items() if k not in ("ORTHOSERVE_RUN_ID", "TORCHELASTIC_RUN_ID")}
            env["TORCHELASTIC_RUN_ID"] = run_id
            logs[label] = open(tmp_path / f"{label}.log", "wb")
            procs[label] = subprocess.Popen(
                [sys.executable, str(HERE / "isolation_rank.py"), "--address", target[0].address, "--job", "sweep",
                 "--group", "fsdp", "--step", "0", "--rank", label[1], "--world", str(WORLD), "--seed", str(seed),
                 "--dir", str(tmp_path), "--label", label], stdout=logs[label], stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"{label}.ready").exists() for label in order):
            dead = {label: p.returncode for label, p in procs.items() if p.poll() is not None}
            assert not dead and time.monotonic() < deadline, (dead, _logs(tmp_path, order))
            time.sleep(0.02)
        for label in order:  # Interleaved: the runs' ranks arrive alternately.
            (tmp_path / f"{label}.go").touch()
            time.sleep(0.25)
        for label, p in procs.items():
            assert p.wait(timeout=30) == 0, (label, _logs(tmp_path, order))
    finally:
        for p in procs.values():  # Only the rank processes this test started, each by its own handle.
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs.values():
            f.close()
    succeeded = set()
    for label in order:
        run_id, seed = runs[label[0]]
        outcome = json.loads((tmp_path / f"{label}.json").read_text())
        assert outcome["run_id"] == run_id  # From TORCHELASTIC_RUN_ID.
        got = np.load(tmp_path / f"{label}.npy") if outcome["ok"] else None
        if check_answer(f"rank {label[1]} of run {label[0]}", outcome, got, seed, int(label[1])):
            succeeded.add(label)
    assert {"A0", "A1"} <= succeeded or {"B0", "B1"} <= succeeded, f"no run succeeded: {succeeded}"


def _logs(tmp_path: pathlib.Path, labels) -> str:
    return "\n".join(f"--- {label}:\n{(tmp_path / f'{label}.log').read_text(errors='replace')[-2000:]}"
                     for label in labels if (tmp_path / f"{label}.log").exists())


# -- Muon defaults on two gloo runs -------------------------------------------------------------------------

MUON_SHAPE = (256, 128)


def _muon_rank(rank, world, launch, seeds, late, out_dir):
    """One rank of launch `launch`: a Shard(0) DTensor weight of run seeds[launch], its gradient, one step of
    orthoserve.torch.Muon(params, lr=0.02) (the server from ORTHOSERVE_ADDRESS, the run id agreed over the process
    group); rank late[launch] (if any) 1.5 s after the other. Writes its local block or its error."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import orthoserve
    from orthoserve.torch import Muon

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(seeds[launch])
    w0, grad = torch.randn(MUON_SHAPE, generator=g), torch.randn(MUON_SHAPE, generator=g)
    weight = torch.nn.Parameter(distribute_tensor(w0, mesh, [Shard(0)]))
    opt = Muon([weight], lr=0.02)
    weight.grad = distribute_tensor(grad, mesh, [Shard(0)])
    if rank == late[launch]:
        time.sleep(1.5)
    outcome = {"run_id": opt.run_id, "job": opt.job}
    try:
        opt.step()
        outcome["ok"] = True
        np.save(os.path.join(out_dir, f"launch{launch}-rank{rank}.npy"), weight.to_local().detach().numpy())
    except orthoserve.OrthoserveError as e:
        outcome.update(ok=False, code=e.code.name, message=e.message)
    with open(os.path.join(out_dir, f"launch{launch}-rank{rank}.json"), "w") as f:
        json.dump(outcome, f)


def _muon_outcomes(out_dir: pathlib.Path, launch: int) -> List[Tuple[Dict, Optional[np.ndarray]]]:
    out = []
    for rank in range(WORLD):
        outcome = json.loads((out_dir / f"launch{launch}-rank{rank}.json").read_text())
        out.append((outcome, np.load(out_dir / f"launch{launch}-rank{rank}.npy") if outcome["ok"] else None))
    return out


def test_two_muon_runs_with_defaults_get_the_weights_they_get_alone(target, tmp_path):
    env = {"ORTHOSERVE_ADDRESS": target[0].address}
    seeds = [11, 22]
    alone = []
    for i, seed in enumerate(seeds):  # Each run alone first: its weights are what it must get with the other.
        (tmp_path / f"alone{i}").mkdir()
        run_launches([(WORLD, env)], _muon_rank, [seed], [None], str(tmp_path / f"alone{i}"), timeout=5)
        outcomes = _muon_outcomes(tmp_path / f"alone{i}", 0)
        assert all(o["ok"] for o, _ in outcomes), outcomes
        alone.append([w for _, w in outcomes])
    assert not np.array_equal(alone[0][0], alone[1][0])  # The runs differ, so a mixed step would show.
    # Both at once, one rank of each 1.5 s late: A's rank 1 and B's rank 0, so that A0 and B1 arrive together.
    (tmp_path / "both").mkdir()
    run_launches([(WORLD, env), (WORLD, env)], _muon_rank, seeds, [1, 0], str(tmp_path / "both"), timeout=5)
    runs = [_muon_outcomes(tmp_path / "both", launch) for launch in range(2)]
    ids = [{o["run_id"] for o, _ in run} for run in runs]
    jobs = [{o["job"] for o, _ in run} for run in runs]
    assert all(len(s) == 1 for s in ids + jobs), (ids, jobs)  # One run id, one job per run...
    assert ids[0] != ids[1] and jobs[0] != jobs[1]  # ...and not the other run's: the runs never meet on a step.
    for launch, run in enumerate(runs):
        for rank, (outcome, weight) in enumerate(run):
            assert outcome["ok"], (launch, rank, outcome)
            assert np.array_equal(weight, alone[launch][rank]), (
                f"run {launch} rank {rank}: updated weight differs from the same run alone (sum "
                f"{alone[launch][rank].sum():.6f} alone, {weight.sum():.6f} now)")


# -- retries of a finished step ------------------------------------------------------------------------------

def raw_step(address: str, run_id: str, rank: int, seed: int, attempt: int, step: int, job: str,
             group: str) -> Tuple[Dict, Optional[np.ndarray]]:
    """One OrthogonalizeStream of trainer rank `rank` (of WORLD) sent by hand, without the client's checks: run
    seed's block, the given attempt and run id. Returns (outcome, the result block or None); the result's
    MatrixResult must name what was sent."""
    (r0, c0), (rows, cols) = orthoserve.chunk_blocks(SHAPE, WORLD, 0)[rank]
    block = np.ascontiguousarray(run_matrix(seed)[r0:r0 + rows, c0:c0 + cols])
    sent = pb.Block(row_offset=r0, col_offset=c0, rows=rows, cols=cols)
    spec = pb.MatrixSpec(name="w", shape=SHAPE, dtype=pb.DTYPE_FP32, block=sent,
                         options=orthoserve.options.ns_options(dict(OPTIONS)))
    payload = block.tobytes()
    requests = [pb.StreamRequest(header=pb.StepHeader(job=job, group=group, step=step, rank=rank, world=WORLD,
                                                      num_matrices=1, attempt=attempt, run_id=run_id)),
                pb.StreamRequest(spec=spec)]
    requests += [pb.StreamRequest(chunk=pb.DataChunk(index=0, data=payload[i:i + (1 << 20)]))
                 for i in range(0, len(payload), 1 << 20)]
    requests.append(pb.StreamRequest(end=pb.StepEnd()))
    with grpc.insecure_channel(address) as channel:
        try:
            responses = list(pb_grpc.OrthogonalizerStub(channel).OrthogonalizeStream(iter(requests), timeout=30))
        except grpc.RpcError as e:
            return {"ok": False, "code": e.code().name, "message": e.details() or ""}, None
    [result] = [r.result for r in responses if r.WhichOneof("kind") == "result"]
    if result.code != 0:
        return {"ok": False, "code": _code_name(result.code), "message": result.message}, None
    assert (result.index, result.name, list(result.shape), result.block) == (0, "w", list(SHAPE), sent), result
    data = b"".join(r.chunk.data for r in responses if r.WhichOneof("kind") == "chunk")
    return {"ok": True}, np.frombuffer(data, dtype="<f4").reshape(rows, cols)


def _code_name(value: int) -> str:
    """The name of google.rpc.Code `value` (an in-band MatrixResult.code)."""
    return next((c.name for c in grpc.StatusCode if c.value[0] == value), f"code {value}")


def member_for(target, rank: int) -> str:
    """The address trainer rank `rank` of WORLD streams to (floor(rank * M / W) of the M members)."""
    return target[rank * len(target) // WORLD].address


def both_ranks(target, run_id: str, seed: int, attempt: int, job: str, group: str):
    outcomes = [None] * WORLD

    def send(rank):
        outcomes[rank] = raw_step(member_for(target, rank), run_id, rank, seed, attempt, 0, job, group)

    threads = [threading.Thread(target=send, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return outcomes


def test_a_new_runs_retry_of_a_finished_step_is_never_answered_from_the_other_runs_blocks(target):
    job, group = f"retry-{uuid.uuid4().hex[:8]}", "fsdp"
    a, b = f"run-A-{uuid.uuid4().hex[:8]}", f"run-B-{uuid.uuid4().hex[:8]}"
    # Run A finishes step 0.
    for rank, (outcome, got) in enumerate(both_ranks(target, a, 1, 0, job, group)):
        assert check_answer(f"run A rank {rank}", outcome, got, 1, rank), outcome
    # Run B's rank 0 sends step 0 as a retry (attempt 1) with its own data: its partner never comes, so its own
    # result is impossible; anything but a clear error is another run's data.
    outcome, got = raw_step(member_for(target, 0), b, 0, 2, 1, 0, job, group)
    check_answer("run B rank 0 retrying alone", outcome, got, 2, 0)
    assert not outcome["ok"], "a lone retry of run B got a result: it can only have come from run A's blocks"
    # Both of run B's ranks retry step 0: each gets its own result, or a clear error.
    for rank, (outcome, got) in enumerate(both_ranks(target, b, 2, 1, job, group)):
        check_answer(f"run B rank {rank} retrying", outcome, got, 2, rank)


def test_a_retry_with_other_blocks_is_never_answered_from_the_kept_ones(target):
    job, group = f"digest-{uuid.uuid4().hex[:8]}", "fsdp"
    run = f"run-{uuid.uuid4().hex[:8]}"
    for rank, (outcome, got) in enumerate(both_ranks(target, run, 1, 0, job, group)):
        assert check_answer(f"rank {rank}", outcome, got, 1, rank), outcome
    # The same run's rank 0 retries with other blocks (seed 3): the kept blocks of rank 1 belong to another matrix,
    # so no result is right.
    outcome, got = raw_step(member_for(target, 0), run, 0, 3, 1, 0, job, group)
    check_answer("rank 0 retrying with other blocks", outcome, got, 3, 0)
    assert not outcome["ok"], "a retry with other blocks was answered (from the original's kept blocks)"
    # With its original blocks it gets its own result again (a replay), or a clear error.
    outcome, got = raw_step(member_for(target, 0), run, 0, 1, 2, 0, job, group)
    check_answer("rank 0 retrying with its blocks", outcome, got, 1, 0)
