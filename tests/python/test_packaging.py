"""The client installs on its own: `pip install client/python` into a fresh venv, offline from the wheelhouse that
`scripts/setup_python.sh --with-torch` fills (the base set's wheels), brings only grpcio, protobuf and numpy (and
grpcio's typing_extensions), generates the gRPC stubs in the build, and does a real round trip against the server
without torch (orthoserve.torch and orthoserve.optax then say what to install); an sdist carries the proto and builds a
wheel with the stubs too. The pins of the build requirement, the runtime bounds and the generated stubs agree, and the
server's set-up installs neither torch nor jax."""

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

from conftest import REPO

PACKAGE = REPO / "client" / "python"
WHEELHOUSE = REPO / os.environ.get("ORTHOSERVE_VENV", ".venv") / "wheelhouse"
# What a client-only environment may hold: the package, its three dependencies (and grpcio's typing_extensions),
# and what `python -m venv` puts in every environment.
ALLOWED = {"orthoserve", "grpcio", "protobuf", "numpy", "typing-extensions", "pip", "setuptools"}


def pins(path):
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[re.sub(r"[-_.]+", "-", name).lower()] = version
    return out


def copy_sources(dest):
    """client/python and proto/ in their repository layout, without build products or generated stubs."""
    ignore = shutil.ignore_patterns("_proto", "build", "dist", "*.egg-info", "__pycache__")
    shutil.copytree(PACKAGE, dest / "client" / "python", ignore=ignore)
    shutil.copytree(REPO / "proto", dest / "proto", ignore=shutil.ignore_patterns("*.cc", "*.h", "CMakeLists.txt"))
    return dest / "client" / "python"


ROUND_TRIP = r"""
import importlib.metadata, importlib.util, json, sys
import numpy as np
import orthoserve
assert importlib.util.find_spec("torch") is None, "torch is installed"
with orthoserve.Client(sys.argv[1], timeout=60) as client:
    g = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    [u] = client.orthogonalize([g], precision="highest", scale_mode="none", steps=10,
                               coefficients="polar_express")
    # The result is (nearly) orthogonal: its singular values are close to 1.
    s = np.linalg.svd(u.astype(np.float64), compute_uv=False)
    assert u.shape == g.shape and u.dtype == np.float32 and abs(s - 1).max() < 0.05, s
# The shared-memory modules load without torch (a region's torch tensors import it when asked for).
import orthoserve.region_transport, orthoserve.shm
assert orthoserve.region_transport.shm_mode(None) in ("auto", "on", "off") and orthoserve.shm.ALIGNMENT == 64
try:
    import orthoserve.torch
except ImportError as e:
    torch_error = str(e)
else:
    torch_error = None
try:
    import orthoserve.optax
except ImportError as e:
    optax_error = str(e)
else:
    optax_error = None
print(json.dumps({"dists": sorted(d.metadata["Name"] for d in importlib.metadata.distributions()),
                  "torch_error": torch_error, "optax_error": optax_error, "file": orthoserve.__file__}))
"""


def run(args, **kw):
    out = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300, **kw)
    assert out.returncode == 0, f"{args}:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def test_client_installs_alone_in_a_fresh_venv(server, tmp_path):
    base = pins(PACKAGE / "requirements.txt")
    wanted = {"grpcio", "protobuf", "numpy", "typing-extensions", "grpcio-tools", "setuptools"}
    have = {re.sub(r"[-_.]+", "-", f.name.split("-")[0]).lower() for f in WHEELHOUSE.glob("*.whl")}
    if not WHEELHOUSE.is_dir() or not wanted <= have:
        pytest.fail(f"the wheelhouse {WHEELHOUSE} lacks {sorted(wanted - have)}: run scripts/setup_python.sh "
                    "--with-torch (it downloads the base set's wheels there)")
    source = copy_sources(tmp_path / "src")
    venv = tmp_path / "venv"
    run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv])
    pip = [venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check", "-q"]
    offline = ["--no-index", "--find-links", WHEELHOUSE]
    # Nothing of this interpreter's paths: PYTHONPATH (a worktree's sources) would shadow the installed copy.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    # `pip install client/python`: builds the wheel (build isolation: setuptools and grpcio-tools from the
    # wheelhouse) and installs it with its dependencies.
    run(pip + ["install", *offline, source], env=env)
    result = run([venv / "bin" / "python", "-c", ROUND_TRIP, server.address], cwd=tmp_path, env=env)
    import json

    report = json.loads(result.strip().splitlines()[-1])
    names = {re.sub(r"[-_.]+", "-", n).lower() for n in report["dists"]}
    assert names <= ALLOWED and {"orthoserve", "grpcio", "protobuf", "numpy"} <= names, names
    assert report["file"].startswith(str(venv)), report["file"]  # The installed copy, not the repository's.
    assert "pip install torch" in report["torch_error"]
    assert "pip install 'optax==0.2.8'" in report["optax_error"]
    versions = {n: v for n, v in (line.split("==") for line in run(
        [venv / "bin" / "python", "-m", "pip", "freeze"], env=env).split() if "==" in line)}
    for name in ("grpcio", "protobuf", "numpy"):
        assert versions[name] == base[name]  # From the wheelhouse: the project's pins.

    # An sdist carries the proto (not the repository around it) and builds a wheel with the stubs.
    sdist_dir = tmp_path / "sdist"
    run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(sdist_dir)!r})"],
        cwd=source)
    [sdist] = sdist_dir.glob("orthoserve-*.tar.gz")
    run(pip + ["wheel", "--no-deps", *offline, sdist, "-w", tmp_path / "from-sdist"], env=env, cwd=tmp_path)
    [wheel] = (tmp_path / "from-sdist").glob("orthoserve-*.whl")
    files = set(zipfile.ZipFile(wheel).namelist())
    assert {"orthoserve/_proto/v1/orthogonalizer_pb2.py", "orthoserve/_proto/v1/orthogonalizer_pb2_grpc.py",
            "orthoserve/_proto/v1/orthogonalizer_pb2.pyi", "orthoserve/py.typed", "orthoserve/torch/muon.py",
            "orthoserve/optax/muon.py"} <= files


def test_pins_bounds_and_stubs_agree():
    project = tomllib.loads((PACKAGE / "pyproject.toml").read_text())
    base = pins(PACKAGE / "requirements.txt")
    torch_set = pins(PACKAGE / "requirements-torch.txt")
    jax_set = pins(PACKAGE / "requirements-jax.txt")
    assert not set(base) & set(torch_set) and not set(base) & set(jax_set)
    assert "torch" in torch_set and not {"torch", "triton", "absl-py", "jax", "jaxlib", "optax"} & set(base)
    # The jax set may repeat a torch-set package (absl-py) only at the same version: the two combine.
    assert all(torch_set[name] == jax_set[name] for name in set(torch_set) & set(jax_set))
    assert {"jax", "jaxlib", "optax"} <= set(jax_set) and jax_set["jax"] == jax_set["jaxlib"]
    # orthoserve.optax rebinds that optax's code: the extra pins the same version.
    assert f"optax=={jax_set['optax']}" in project["project"]["optional-dependencies"]["optax"]
    # The build generates the stubs with the pinned grpcio-tools.
    assert f"grpcio-tools=={base['grpcio-tools']}" in project["build-system"]["requires"]
    # The runtime lower bounds are what those stubs check at import, and the pins satisfy them.
    stubs = PACKAGE / "src" / "orthoserve" / "_proto" / "v1"
    grpc_generated = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'",
                               (stubs / "orthogonalizer_pb2_grpc.py").read_text()).group(1)
    protobuf_gencode = re.search(r"Protobuf Python Version: ([\d.]+)",
                                 (stubs / "orthogonalizer_pb2.py").read_text()).group(1)
    deps = {re.split(r"[<>=!~ ]", d)[0]: d for d in project["project"]["dependencies"]}
    assert set(deps) == {"grpcio", "protobuf", "numpy"}
    assert deps["grpcio"] == f"grpcio>={grpc_generated}" and deps["protobuf"] == f"protobuf>={protobuf_gencode}"

    def version(v):
        return tuple(int(p) for p in v.split("."))

    assert version(base["grpcio"]) >= version(grpc_generated)
    assert version(base["protobuf"]) >= version(protobuf_gencode)
    assert project["project"]["optional-dependencies"]["torch"]


def test_the_servers_setup_does_not_install_torch():
    setup = (REPO / "scripts" / "setup.sh").read_text()
    calls = re.findall(r"scripts/setup_python\.sh[^\n]*", setup)
    assert calls and not any("--with-torch" in c or "--with-jax" in c for c in calls), calls
    assert "setup_python.sh --with-torch --with-jax" in (REPO / "scripts" / "test_python.sh").read_text()
    # The base set's pip install reads requirements.txt only; the torch set is behind --with-torch.
    script = (REPO / "scripts" / "setup_python.sh").read_text()
    base_part, _, torch_part = script.partition("if ((with_torch)); then")
    assert "$torch_requirements" not in base_part and "$eo_pin" not in base_part
    assert "$torch_requirements" in torch_part
    assert "$jax_requirements" not in base_part and "if ((with_jax)); then" in torch_part
    assert "$jax_requirements" in torch_part.partition("if ((with_jax)); then")[2]
