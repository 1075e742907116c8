"""pytest plugin: Emerging-Optimizers' newton_schulz replaced by orthoserve.torch.newton_schulz, and nothing else.

    ORTHOSERVE_ADDRESS=HOST:PORT pytest -p eo_plugin ...     # with client/python/tools on PYTHONPATH

Used by scripts/peer_tests.sh to run Emerging-Optimizers v0.3.0's own tests through the service. The two module
attributes that hold the function are the only change: every EO caller (its optimizers, newton_schulz_tp,
spectral clipping) looks the function up there at call time.
"""


def pytest_configure(config):
    import orthoserve.torch
    from emerging_optimizers.orthogonalized_optimizers import muon_utils, spectral_clipping_utils

    muon_utils.newton_schulz = orthoserve.torch.newton_schulz
    spectral_clipping_utils.newton_schulz = orthoserve.torch.newton_schulz
