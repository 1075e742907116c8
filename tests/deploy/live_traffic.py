#!/usr/bin/env python3
"""Mixed traffic against a two-rank local fleet, for the live dashboard check of scripts/check_deploy.sh.

    live_traffic.py RANK0_HOST:PORT RANK1_HOST:PORT --over-limit-rows N

Sends, through the orthoserve Python client (client/python/src; needs grpcio, protobuf and numpy):
  - a lone unary call (Orthogonalize) to rank 0;
  - a lone stream step (OrthogonalizeStream) to rank 1, which the formed fleet runs as a batch;
  - a group step of W = 2 trainer ranks with the TP_DISTRIBUTED algorithm (trainer rank r streams its row
    block to fleet rank r), whose stitched result must equal the lone result of the whole matrix;
  - a second group step with a good matrix and one whose blocks do not fit its algorithm (an in-band error
    of that matrix only);
  - a request the server rejects: a group step header without a job (INVALID_ARGUMENT);
  - an over-limit request: an N x N fp32 matrix whose bytes exceed the ranks' --max-inflight-bytes
    (RESOURCE_EXHAUSTED);
  - a last lone unary call to each rank, --settle seconds (3 s: three of the check's 1 s scrapes) after the
    rest: series that only lone unary calls feed (the per-tenant compute-queue wait, for one) were created by
    the first call, and need a second observation after Prometheus has scraped them for a rate to exist.
Each outcome is checked; prints one line per request and exits 1 if any differs from what is expected.
"""
import argparse
import pathlib
import sys
import threading
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "client/python/src"))

import grpc  # noqa: E402
import numpy as np  # noqa: E402

import orthoserve  # noqa: E402
from orthoserve._proto.v1 import orthogonalizer_pb2 as pb  # noqa: E402
from orthoserve._proto.v1 import orthogonalizer_pb2_grpc as pb_grpc  # noqa: E402

# The run of this script's group steps: its two trainer threads share it, and no other run has it.
RUN_ID = f"check-deploy-{uuid.uuid4().hex}"

TIMEOUT = 60.0


def expect_error(what, code, call):
    try:
        call()
    except orthoserve.OrthoserveError as e:
        if e.code != code:
            raise AssertionError(f"{what}: expected {code.name}, got {e}") from None
        return str(e)
    except grpc.RpcError as e:
        if e.code() != code:
            raise AssertionError(f"{what}: expected {code.name}, got {e.code().name}: {e.details()}") from None
        return f"{e.code().name}: {e.details()}"
    raise AssertionError(f"{what}: expected {code.name}, but the call succeeded")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rank0")
    ap.add_argument("rank1")
    ap.add_argument("--over-limit-rows", type=int, required=True,
                    help="side of a square fp32 matrix that exceeds the ranks' --max-inflight-bytes")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds to wait before the last unary calls (a few of Prometheus's scrape intervals)")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(7)
    g = rng.standard_normal((64, 32), dtype=np.float32)
    failures = []

    def step(what, fn):
        try:
            detail = fn()
            print(f"ok: {what}{': ' + detail if detail else ''}")
        except Exception as e:  # noqa: BLE001 -- every failure is reported, the others still run
            print(f"FAILED: {what}: {e}")
            failures.append(what)

    lone0 = orthoserve.Client(a.rank0, timeout=TIMEOUT)
    lone1 = orthoserve.Client(a.rank1, timeout=TIMEOUT)
    reference = {}

    def unary():
        reference["u"] = lone0.orthogonalize(g, method="unary", precision="highest")
        return f"{g.shape} -> {reference['u'].shape}"

    def stream():
        out = lone1.orthogonalize(g, precision="highest")
        worst = float(np.max(np.abs(out - reference["u"]))) if "u" in reference else 0.0
        if worst > 1e-4:
            raise AssertionError(f"the stream's result differs from the unary one by {worst:.3g}")
        return f"max |stream - unary| = {worst:.2g}"

    def group_step():
        fleet = orthoserve.Client([a.rank0, a.rank1], timeout=TIMEOUT)
        results, errors = [None, None], []
        blocks = orthoserve.chunk_blocks(g.shape, 2, 0)

        def trainer(rank):
            try:
                (r0, c0), (rows, cols) = blocks[rank]
                shard = orthoserve.Shard("w", g.shape, (r0, c0), g[r0:r0 + rows, c0:c0 + cols],
                                         algorithm="tp_distributed", partition_dim=0, precision="highest")
                [results[rank]] = fleet.group("check-deploy", "tp", rank, 2, run_id=RUN_ID).step(1, [shard])
            except Exception as e:  # noqa: BLE001
                errors.append(f"trainer rank {rank}: {e}")

        threads = [threading.Thread(target=trainer, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(2 * TIMEOUT)
        if errors or any(r is None for r in results):
            raise AssertionError("; ".join(errors) or "a trainer rank did not finish")
        whole = np.concatenate(results)
        worst = float(np.max(np.abs(whole - reference["u"]))) if "u" in reference else 0.0
        if worst > 1e-3:
            raise AssertionError(f"the group step's result differs from the lone one by {worst:.3g}")
        return f"W = 2, tp_distributed, max |group - lone| = {worst:.2g}"

    def bad_matrix():
        # A second group step whose second matrix is split by columns under row_sharded: the fleet runs the
        # good matrix and fails the bad one alone, in-band (the client raises for it, naming it).
        fleet = orthoserve.Client([a.rank0, a.rank1], timeout=TIMEOUT)
        errors = [None, None]

        def trainer(rank):
            good = orthoserve.Shard("w", g.shape, (32 * rank, 0), g[32 * rank:32 * rank + 32],
                                    algorithm="tp_distributed", partition_dim=0)
            bad = orthoserve.Shard("bad", g.shape, (0, 16 * rank), g[:, 16 * rank:16 * rank + 16],
                                   algorithm="row_sharded")
            try:
                fleet.group("check-deploy", "tp", rank, 2, run_id=RUN_ID).step(2, [good, bad])
                errors[rank] = "the step succeeded"
            except orthoserve.OrthoserveError as e:
                errors[rank] = e

        threads = [threading.Thread(target=trainer, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(2 * TIMEOUT)
        for rank, e in enumerate(errors):
            if not isinstance(e, orthoserve.OrthoserveError) or e.code != grpc.StatusCode.INVALID_ARGUMENT or \
                    e.matrix != "bad":
                raise AssertionError(f"trainer rank {rank}: expected INVALID_ARGUMENT for matrix 'bad', got {e}")
        return str(errors[0]).splitlines()[0]

    def rejected():
        # A group step (world 2) without a job: the server refuses the header.
        with grpc.insecure_channel(a.rank1) as channel:
            stub = pb_grpc.OrthogonalizerStub(channel)
            header = pb.StreamRequest(header=pb.StepHeader(world=2, rank=0, step=1, num_matrices=1))
            return expect_error("a header without a job", grpc.StatusCode.INVALID_ARGUMENT,
                                lambda: list(stub.OrthogonalizeStream(iter([header]), timeout=TIMEOUT)))

    def over_limit():
        n = a.over_limit_rows
        big = np.ones((n, n), dtype=np.float32)
        return expect_error("an over-limit matrix", grpc.StatusCode.RESOURCE_EXHAUSTED,
                            lambda: lone0.orthogonalize(big)).splitlines()[0]

    step("lone unary call to rank 0", unary)
    step("lone stream step to rank 1", stream)
    step("group step of 2 trainer ranks over both fleet ranks", group_step)
    step("a group step with a bad matrix (in-band INVALID_ARGUMENT)", bad_matrix)
    step("a rejected request (INVALID_ARGUMENT)", rejected)
    step("an over-limit request (RESOURCE_EXHAUSTED)", over_limit)

    def unary_again():
        time.sleep(a.settle)
        for lone in (lone0, lone1):
            out = lone.orthogonalize(g, method="unary", precision="highest")
            worst = float(np.max(np.abs(out - reference["u"]))) if "u" in reference else 0.0
            if worst > 1e-4:
                raise AssertionError(f"a later unary result differs from the first by {worst:.3g}")
        return "both ranks, same result"

    step("a last lone unary call to each rank", unary_again)
    print(f"traffic: {7 - len(failures)} of 7 requests as expected")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
