"""Where a group step's run id (StepHeader.run_id) comes from, in order: an explicit run_id=, ORTHOSERVE_RUN_ID,
TORCHELASTIC_RUN_ID (not torchrun's placeholder "none"), an id agreed over an initialized torch.distributed default
group (the same on every rank of one launch, different for another launch), else ValueError saying how to give one.
The id is sent on every attempt of a group step and never for a lone step; the plain client resolves it without
importing torch; orthoserve.torch.Muon's default job is one per run ("muon-<run id>")."""

import json
import os
import subprocess
import sys

import grpc
import numpy as np
import pytest
import torch

import orthoserve
from orthoserve import runs
from dist_util import run_launches
from fake_server import FakeServer, Failure

pytestmark = pytest.mark.deadline(60)

FAST = orthoserve.RetryPolicy(initial_backoff=0.0, max_backoff=0.0, deadline=10)
M = np.ones((3, 4), np.float32)


@pytest.fixture()
def no_run_env(monkeypatch):
    """No run id in the environment, whatever the test's own environment holds."""
    for name in (runs.ENV_RUN_ID, runs.ENV_TORCHELASTIC_RUN_ID, "ORTHOSERVE_JOB"):
        monkeypatch.delenv(name, raising=False)
    assert not torch.distributed.is_initialized()  # The test process never joins a process group.
    return monkeypatch


@pytest.fixture()
def fake():
    s = FakeServer()
    yield s
    s.stop()


def test_the_order_explicit_then_orthoserve_then_torchelastic_then_none(no_run_env):
    env = no_run_env
    with pytest.raises(ValueError, match="ORTHOSERVE_RUN_ID") as err:
        runs.resolve_run_id()
    for how in ("run_id=", "TORCHELASTIC_RUN_ID", "torchrun", "torch.distributed"):
        assert how in str(err.value)
    assert runs.find_run_id() is None
    env.setenv(runs.ENV_TORCHELASTIC_RUN_ID, "none")  # torchrun's placeholder: the same in every such launch.
    assert runs.find_run_id() is None
    env.setenv(runs.ENV_TORCHELASTIC_RUN_ID, "elastic-1")
    assert runs.resolve_run_id() == "elastic-1"
    env.setenv(runs.ENV_RUN_ID, "  ours-1 ")
    assert runs.resolve_run_id() == "ours-1"
    assert runs.resolve_run_id("explicit-1") == "explicit-1"
    env.setenv(runs.ENV_RUN_ID, "")  # Empty is unset.
    assert runs.resolve_run_id() == "elastic-1"
    with pytest.raises(ValueError, match="must not be empty"):
        runs.resolve_run_id("")
    with pytest.raises(TypeError, match="must be a str"):
        runs.resolve_run_id(7)


def test_groups_send_the_run_id_on_every_attempt_and_lone_steps_none(no_run_env, fake):
    env = no_run_env
    with orthoserve.Client(fake.address, retry=FAST) as client:
        with pytest.raises(ValueError, match=r"group job/g \(world > 1\) needs a run id"):
            client.group("job", "g", 0, 2)
        env.setenv(runs.ENV_TORCHELASTIC_RUN_ID, "elastic-2")
        assert client.group("job", "g", 0, 2).run_id == "elastic-2"
        env.setenv(runs.ENV_RUN_ID, "ours-2")
        group = client.group("job", "g", 1, 2)
        assert group.run_id == "ours-2"
        assert client.group("job", "g", 1, 2, run_id="explicit-2").run_id == "explicit-2"
        fake.servicer.fail(Failure(grpc.StatusCode.UNAVAILABLE, method="stream"))
        group.step(3, [orthoserve.Shard("w", (6, 4), (3, 0), M)])
        lone = client.group("job", "g", 0, 1, run_id="ignored")
        assert lone.run_id is None
        lone.step(4, [orthoserve.Shard("w", (3, 4), (0, 0), M)])
        client.orthogonalize(M)
    assert [(h.step, h.attempt, h.run_id) for h in fake.headers] == [(3, 0, "ours-2"), (3, 1, "ours-2"), (4, 0, ""),
                                                                     (0, 0, "")]


def test_the_plain_client_resolves_without_importing_torch(tmp_path):
    code = """
import os, sys
import orthoserve
for name in ("ORTHOSERVE_RUN_ID", "TORCHELASTIC_RUN_ID"):
    os.environ.pop(name, None)
client = orthoserve.Client("127.0.0.1:1")
try:
    client.group("job", "g", 0, 2)
    raise SystemExit("no ValueError")
except ValueError as e:
    assert "ORTHOSERVE_RUN_ID" in str(e), e
os.environ["TORCHELASTIC_RUN_ID"] = "launch-3"
assert client.group("job", "g", 0, 2).run_id == "launch-3"
assert "torch" not in sys.modules, "the plain client imported torch"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_muon_default_job_is_one_per_run(no_run_env, fake):
    from orthoserve.torch import Muon
    from orthoserve.torch.muon import _default_job

    env = no_run_env
    p = torch.nn.Parameter(torch.ones(3, 4))
    client = orthoserve.Client(fake.address)
    try:
        opt = Muon([p], client=client)
        assert opt.run_id is None and opt.job is None  # No run id: nothing to name yet; whole tensors still step.
        p.grad = torch.ones(3, 4)
        opt.step()
        assert Muon([p], client=client, run_id="r-1").job == "muon-r-1"
        env.setenv(runs.ENV_TORCHELASTIC_RUN_ID, "elastic-4")
        opt = Muon([p], client=client)
        assert (opt.run_id, opt.job) == ("elastic-4", "muon-elastic-4")
        assert Muon([p], client=client, job="mine").job == "mine"
        env.setenv("ORTHOSERVE_JOB", "env-job")
        assert Muon([p], client=client).job == "env-job"
        long = "x" * 200
        assert _default_job(long).startswith("muon-") and len(_default_job(long)) == 37
        assert _default_job(long) != _default_job(long + "y")
    finally:
        client.close()


def _agreement_rank(rank, world, launch, out_dir):
    import typing

    import typing_extensions

    typing.override = getattr(typing, "override", typing_extensions.override)
    import torch.distributed as dist

    import orthoserve.torch as ot
    from orthoserve import runs
    from orthoserve.torch import tp_groups

    assert runs.agreed_run_id() is None
    p = torch.nn.Parameter(torch.ones(4, 4))
    opt = ot.Muon([p])  # Every rank constructs it: the agreement (a collective) happens here.
    agreed = opt.run_id
    assert agreed and runs.agreed_run_id() == agreed and runs.agree_run_id() == agreed  # Cached: no new collective.
    assert opt.job == f"muon-{agreed}"
    # The environment and an explicit id still come first.
    os.environ[runs.ENV_TORCHELASTIC_RUN_ID] = "elastic-5"
    assert runs.resolve_run_id() == "elastic-5"
    os.environ[runs.ENV_RUN_ID] = "ours-5"
    assert runs.resolve_run_id() == "ours-5" and runs.resolve_run_id("explicit-5") == "explicit-5"
    del os.environ[runs.ENV_RUN_ID], os.environ[runs.ENV_TORCHELASTIC_RUN_ID]
    assert runs.resolve_run_id() == agreed
    # newton_schulz(tp_group=...) takes the agreed id too.
    state = tp_groups._tp_state(dist.group.WORLD, torch.device("cpu"))
    ids = [None] * world
    dist.all_gather_object(ids, (agreed, state.run_id))
    if rank == 0:
        with open(os.path.join(out_dir, f"launch{launch}.json"), "w") as f:
            json.dump(ids, f)


def test_torch_distributed_ranks_agree_and_launches_differ(tmp_path):
    run_launches([(2, {}), (2, {})], _agreement_rank, str(tmp_path), timeout=30)
    launches = [json.loads((tmp_path / f"launch{i}.json").read_text()) for i in range(2)]
    for ranks in launches:
        assert len({tuple(r) for r in ranks}) == 1, ranks  # Both ranks: one id, for Muon and for the tp group.
        [(agreed, tp)] = {tuple(r) for r in ranks}
        assert len(agreed) == 32 and tp == agreed
    assert launches[0][0][0] != launches[1][0][0]


def _torchelastic_rank(rank, world, launch, out_dir):
    import torch.distributed as dist

    import orthoserve.torch as ot

    opt = ot.Muon([torch.nn.Parameter(torch.ones(4, 4))])
    ids = [None] * world
    dist.all_gather_object(ids, (opt.run_id, opt.job))
    if rank == 0:
        with open(os.path.join(out_dir, f"launch{launch}.json"), "w") as f:
            json.dump(ids, f)


def test_torchelastic_run_id_comes_before_the_agreement(tmp_path):
    run_launches([(2, {"TORCHELASTIC_RUN_ID": "te-a"}), (2, {"TORCHELASTIC_RUN_ID": "none"})], _torchelastic_rank,
                 str(tmp_path), timeout=30)
    a = json.loads((tmp_path / "launch0.json").read_text())
    b = json.loads((tmp_path / "launch1.json").read_text())
    assert a == [["te-a", "muon-te-a"]] * 2
    # torchrun's placeholder "none" is skipped: the ranks agree on a random id instead.
    assert b[0] == b[1] and len(b[0][0]) == 32 and b[0][1] == f"muon-{b[0][0]}"
