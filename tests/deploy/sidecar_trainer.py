#!/usr/bin/env python3
"""The trainer of deploy/k8s/examples/sidecar in miniature, for the live check of scripts/check_deploy.sh.

    ORTHOSERVE_ADDRESS=127.0.0.1:PORT ORTHOSERVE_SHM=on sidecar_trainer.py --metrics 127.0.0.1:MPORT

Run in the trainer container's environment (as the example sets it) against a server started with the sidecar's
flags: two Muon steps through orthoserve.torch (its default client, from ORTHOSERVE_ADDRESS; shm from ORTHOSERVE_SHM)
must go through a shared-memory region, give the parameters that the same steps with shm off give, bit for bit, and
be counted by the server's region metrics. Uses the orthoserve client of client/python/src (needs torch, grpcio,
protobuf, numpy). Prints what it saw; exits 1 when anything differs.
"""
import argparse
import pathlib
import re
import sys
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "client/python/src"))

import torch  # noqa: E402

import orthoserve.torch as ot  # noqa: E402

SHAPES = [(64, 32), (32, 48), (8, 4, 3, 3)]
STEPS = 2


def train(shm):
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in SHAPES]
    opt = ot.Muon(params, lr=0.02, shm=shm)
    for _ in range(STEPS):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return opt, [p.detach().clone() for p in params]


def metric(text, name, labels=""):
    """The sum of the samples of `name` whose labels contain `labels`."""
    total = 0.0
    for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        if labels in (m.group(1) or ""):
            total += float(m.group(2))
    return total


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metrics", required=True, help="the server's metrics address HOST:PORT")
    a = ap.parse_args(argv)
    problems = []
    opt, got = train(None)  # shm from $ORTHOSERVE_SHM, as the trainer container has it.
    transport = opt.region_transport
    print(f"Muon with shm={transport.mode}: transport {opt.transport} ({transport.shm_calls} steps through a region"
          f"{', region ' + str(transport.region.size) + ' bytes' if transport.region else ''})"
          f"{'; ' + transport.reason if transport.reason else ''}")
    if opt.transport != "shm" or transport.shm_calls != STEPS:
        problems.append("the steps did not go through a shared-memory region")
    _, expected = train(False)
    same = all(torch.equal(x, y) for x, y in zip(got, expected))
    print(f"parameters equal to the steps sent as bytes: {same}")
    if not same:
        problems.append("the parameters differ from the steps sent as bytes")
    scrape = urllib.request.urlopen(f"http://{a.metrics}/metrics", timeout=5).read().decode()
    counts = {"orthoserve_shm_matrices_total input": metric(scrape, "orthoserve_shm_matrices_total",
                                                            'direction="input"'),
              "orthoserve_shm_matrices_total result": metric(scrape, "orthoserve_shm_matrices_total",
                                                             'direction="result"'),
              "orthoserve_shm_handovers_total staged": metric(scrape, "orthoserve_shm_handovers_total",
                                                              'outcome="staged"'),
              "orthoserve_shm_regions": metric(scrape, "orthoserve_shm_regions")}
    print(", ".join(f"{k} {v:g}" for k, v in counts.items()))
    if counts["orthoserve_shm_matrices_total input"] < STEPS * len(SHAPES) or \
            counts["orthoserve_shm_matrices_total result"] < STEPS * len(SHAPES):
        problems.append(f"the server counted fewer than {STEPS * len(SHAPES)} matrices read from and written to "
                        "regions")
    if counts["orthoserve_shm_handovers_total staged"] < 1 or counts["orthoserve_shm_regions"] < 1:
        problems.append("the server shows no handover or no registered region")
    for p in problems:
        print(f"FAILED: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
