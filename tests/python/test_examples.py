"""examples/train_small.py trains with the remote Muon and its loss falls."""

import re
import subprocess
import sys

from conftest import REPO


def test_train_small_loss_falls(server):
    out = subprocess.run([sys.executable, str(REPO / "examples" / "train_small.py"), "--address", server.address,
                          "--steps", "25"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    losses = [float(m) for m in re.findall(r"^step\s+\d+ loss (\S+)$", out.stdout, re.M)]
    assert len(losses) == 25
    assert losses[-1] < 0.5 * losses[0], losses
