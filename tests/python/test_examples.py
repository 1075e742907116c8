"""examples/train_small.py trains with the remote Muon and its loss falls; with the default retry policy it rides
through a server that is killed and restarted mid-run, and through a rank of a 3-rank fleet killed and restarted;
with --fallback it trains without a service."""

import re
import signal
import subprocess
import sys
import time

from conftest import REPO, ServerProcess, free_port, require_binary, start_fleet

EXAMPLE = str(REPO / "examples" / "train_small.py")


def losses_of(stdout):
    return [float(m) for m in re.findall(r"^step\s+\d+ loss (\S+)$", stdout, re.M)]


def test_train_small_loss_falls(server):
    out = subprocess.run([sys.executable, EXAMPLE, "--address", server.address, "--steps", "25"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    losses = losses_of(out.stdout)
    assert len(losses) == 25
    assert losses[-1] < 0.5 * losses[0], losses


def train_through(address, kill, restart, tmp_path):
    """Runs train_small.py for 120 steps against `address`; after step 10 calls kill(), then restart() (which returns
    the server processes to stop at the end). Checks that the run completed with a falling loss and returns its
    stdout, stderr and retry count."""
    trainer = subprocess.Popen([sys.executable, EXAMPLE, "--address", address, "--steps", "120"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = []
    try:
        lines = []
        for line in trainer.stdout:
            lines.append(line)
            if line.startswith("step   10 "):
                break
        kill()
        started = restart()
        rest, stderr = trainer.communicate(timeout=300)
    finally:
        if trainer.poll() is None:
            trainer.kill()
        for s in started:
            s.stop()
    stdout = "".join(lines) + rest
    assert trainer.returncode == 0, stderr
    losses = losses_of(stdout)
    assert len(losses) == 120
    assert losses[-1] < 0.5 * losses[0], losses
    return stdout, stderr, int(re.search(r"^retries (\d+)$", stdout, re.M).group(1))


def test_train_small_rides_through_a_server_restart(tmp_path):
    binary = require_binary()
    address = f"127.0.0.1:{free_port()}"
    args = [str(binary), "--listen", address, "--backend", "cpu", "--metrics-address", "",
            "--fleet-listen", f"127.0.0.1:{free_port()}"]
    server = ServerProcess(args, address, tmp_path / "before.log")
    server.wait_ready()

    def kill():  # Killed mid-run (no drain) ...
        server.proc.send_signal(signal.SIGKILL)
        server.stop()

    def restart():  # ... then the same address comes back after a while.
        time.sleep(1.5)
        restarted = ServerProcess(args, address, tmp_path / "after.log")
        restarted.wait_ready()
        return [restarted]

    _, stderr, retries = train_through(address, kill, restart, tmp_path)
    assert retries >= 1 and "UNAVAILABLE" in stderr and "retrying in" in stderr, stderr


def test_train_small_rides_through_a_fleet_rank_restart(tmp_path):
    ranks = start_fleet(tmp_path, 3)

    def kill():  # The rank the trainer talks to is killed mid-run ...
        ranks[1].proc.send_signal(signal.SIGKILL)
        ranks[1].stop()

    def restart():  # ... and comes back half a second later, as Kubernetes restarts a pod; the other two
        time.sleep(0.5)  # ranks go on as the next fleet generation meanwhile.
        return [ServerProcess(ranks[1].args, ranks[1].address, tmp_path / "rank1-restarted.log"), ranks[2], ranks[0]]

    try:
        _, stderr, retries = train_through(ranks[1].address, kill, restart, tmp_path)
    finally:
        for s in ranks:
            s.stop()
    assert retries >= 1, stderr


def test_train_small_falls_back_without_a_service():
    address = f"127.0.0.1:{free_port()}"  # Nothing listens there.
    out = subprocess.run([sys.executable, EXAMPLE, "--address", address, "--steps", "25", "--fallback",
                          "--retry-deadline", "0.2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    losses = losses_of(out.stdout)
    assert len(losses) == 25 and losses[-1] < 0.5 * losses[0], losses
    assert "computing it locally" in out.stderr
