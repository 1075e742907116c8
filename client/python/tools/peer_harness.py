"""pytest plugin: what Emerging-Optimizers' upstream test files need to run under pytest on this project's venv.

Loaded in both runs of scripts/peer_tests.sh (the baseline against EO itself and the run through orthoserve), so
it changes nothing about what is compared. It does what the files' own `absltest.main()` entry points would do:
  - aliases typing.override on Python 3.11 (EO 0.3.0 imports it; typing_extensions has the same decorator);
  - parses the absl flags the files define (--device, --seed) once collection has defined them, from
    $PEER_ABSL_FLAGS (e.g. "--seed=0"; empty: the defaults), as absltest.main parses sys.argv;
  - under torchrun ($WORLD_SIZE set), as test_distributed_muon_utils_cpu.py's __main__: a gloo process group and
    matmul precision "highest"; and each rank writes its own --junitxml file (NAME.xml -> NAME-rank<R>.xml).
"""

import os
import shlex
import typing

import pytest

if not hasattr(typing, "override"):
    import typing_extensions

    typing.override = typing_extensions.override


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if "WORLD_SIZE" not in os.environ:
        return
    xmlpath = getattr(config.option, "xmlpath", None)
    if xmlpath:
        base, ext = os.path.splitext(xmlpath)
        config.option.xmlpath = f"{base}-rank{os.environ['RANK']}{ext}"
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend="gloo")
    torch.set_float32_matmul_precision("highest")


def pytest_collection_finish(session):
    from absl import flags

    flags.FLAGS(["peer_tests"] + shlex.split(os.environ.get("PEER_ABSL_FLAGS", "")))


def pytest_unconfigure(config):
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
