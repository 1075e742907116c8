"""One trainer rank of one run as its own process, for test_run_isolation.py: it sends its row block of its run's
256x128 fp32 matrix as step STEP of group (JOB, GROUP) of WORLD ranks, HIGHEST precision, with the plain client
(numpy; no torch), taking its run id from the environment as a launched trainer does (TORCHELASTIC_RUN_ID).

    python isolation_rank.py --address HOST:PORT --job J --group G --step 0 --rank R --world 2 --seed S \\
        --dir DIR --label A0

Protocol with the test, through files in DIR: once connected it writes LABEL.ready (holding its run id), waits for
LABEL.go (so that the test decides the order in which the ranks of the runs arrive), steps, and writes LABEL.json
({"ok": true} or the error's class, code and message; with its run id and address) and, on success, LABEL.npy (its
result block). Any other failure exits non-zero with a traceback.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np

import orthoserve

SHAPE = (256, 128)
# The options of the float64 reference (oracle.newton_schulz_float64): plain quintic NS, 5 steps, no scale factor.
OPTIONS = dict(precision="highest", coefficients="quintic", steps=5, scale_mode="none")
GO_TIMEOUT = 60.0


def run_matrix(seed: int) -> np.ndarray:
    """The whole matrix of the run with `seed` (every rank of a run holds a block of it)."""
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--step", type=int, default=0)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--dir", type=pathlib.Path, required=True)
    parser.add_argument("--label", required=True)
    args = parser.parse_args()

    full = run_matrix(args.seed)
    (r0, c0), (rows, cols) = orthoserve.chunk_blocks(SHAPE, args.world, 0)[args.rank]
    shard = orthoserve.Shard("w", SHAPE, (r0, c0), full[r0:r0 + rows, c0:c0 + cols], **OPTIONS)
    with orthoserve.Client(args.address, timeout=30, retry=orthoserve.RetryPolicy(deadline=30)) as client:
        group = client.group(args.job, args.group, args.rank, args.world)
        client.info(group.address)  # Connected before the go: the step starts when the test says.
        (args.dir / f"{args.label}.ready").write_text(group.run_id or "")
        go = args.dir / f"{args.label}.go"
        deadline = time.monotonic() + GO_TIMEOUT
        while not go.exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"{args.label}: no {go} after {GO_TIMEOUT} s")
            time.sleep(0.005)
        outcome = {"run_id": group.run_id, "address": group.address}
        try:
            [out] = group.step(args.step, [shard])
            np.save(args.dir / f"{args.label}.npy", out)
            outcome["ok"] = True
        except orthoserve.OrthoserveError as e:
            outcome.update(ok=False, type=type(e).__name__, code=e.code.name, message=e.message)
    (args.dir / f"{args.label}.json").write_text(json.dumps(outcome))


if __name__ == "__main__":
    main()
