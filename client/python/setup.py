"""Build hooks of the orthoserve package (the metadata is in pyproject.toml).

The gRPC stubs (orthoserve._proto) are not in the repository: every build generates them from the .proto with
grpcio-tools, a build requirement pinned to the version of the project's pins (pyproject.toml), so that
`pip install client/python`, a wheel (`pip wheel client/python`) and an editable install all carry stubs that match
the proto. An sdist carries the .proto itself (under proto/), so a wheel built from it generates them the same way.
"""

import pathlib
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "tools"))

import gen_proto  # noqa: E402


STUB_PACKAGES = ["orthoserve._proto", "orthoserve._proto.v1"]


class BuildPyWithStubs(build_py):
    """build_py that first generates src/orthoserve/_proto from the proto and adds its packages to the build
    (they cannot be listed in pyproject.toml: the metadata step requires listed package folders to exist)."""

    def run(self):
        proto_dir = gen_proto.find_proto_dir()
        if proto_dir is None:
            raise SystemExit(f"orthoserve: cannot build the gRPC stubs: no {gen_proto.PROTOS} in "
                             f"{[str(d) for d in gen_proto.PROTO_DIRS]}")
        gen_proto.generate(proto_dir)
        self.packages = list(self.packages or []) + [p for p in STUB_PACKAGES if p not in (self.packages or [])]
        super().run()


class SdistWithProto(sdist):
    """sdist that carries the .proto files under proto/orthoserve/v1 (the stubs are generated when built)."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        proto_dir = gen_proto.find_proto_dir()
        if proto_dir is None:
            raise SystemExit(f"orthoserve: no {gen_proto.PROTOS} to put in the sdist")
        target = pathlib.Path(base_dir) / "proto" / "orthoserve" / "v1"
        target.mkdir(parents=True, exist_ok=True)
        for name in gen_proto.PROTOS:
            shutil.copy(proto_dir / name, target / name)


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto})
