"""pytest plugin: optax's muon, scale_by_muon and orthogonalize_via_newton_schulz replaced by orthoserve.optax's, and
nothing else.

    ORTHOSERVE_ADDRESS=HOST:PORT pytest -p optax_plugin _muon_test.py     # with client/python/tools on PYTHONPATH

Used by scripts/peer_tests_optax.sh to run optax 0.2.8's own muon tests (optax/contrib/_muon_test.py) through the
service. The module attributes that hold the three functions (optax.contrib._muon, which the tests call, and their
re-exports in optax.contrib) are the only change; orthoserve.optax keeps optax's originals, taken at its import, for
its own use.
"""


def pytest_configure(config):
    import optax.contrib
    from optax.contrib import _muon

    import orthoserve.optax

    for module in (_muon, optax.contrib):
        for name in ("muon", "scale_by_muon", "orthogonalize_via_newton_schulz"):
            if hasattr(module, name):
                setattr(module, name, getattr(orthoserve.optax, name))
