"""The Python snippets of README.md ("From Python") and client/python/README.md run as written against a real server:
each document's ```python blocks run in order in one namespace (as a reader pastes them one after another), in a
fresh interpreter with no ORTHOSERVE_* settings, with the documented address 127.0.0.1:50051 replaced by the test
server's. A snippet that uses a name it does not define, or that the code no longer accepts, fails here."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, start_server

DOC_ADDRESS = "127.0.0.1:50051"
DOCS = ["README.md", "client/python/README.md"]

RUNNER = r"""
import json, sys
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for i, code in enumerate(blocks, 1):
    exec(compile(code, f"{sys.argv[2]}, python block {i}", "exec"), namespace)
print(f"ran {len(blocks)} blocks")
"""


def python_blocks(path):
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), re.M | re.S)


@pytest.fixture(scope="module")
def snippet_server(tmp_path_factory):
    # With shared-memory regions on: client/python/README.md shows them.
    d = tmp_path_factory.mktemp("snippets")
    s = start_server(d, ["--shm-socket", str(d / "shm.sock")])
    yield s
    s.stop()


@pytest.mark.parametrize("doc", DOCS)
def test_python_snippets_run(doc, snippet_server, tmp_path):
    blocks = python_blocks(REPO / doc)
    assert blocks, f"{doc} has no python blocks"
    assert DOC_ADDRESS in "".join(blocks), f"{doc}'s snippets no longer use {DOC_ADDRESS}; update this test"
    (tmp_path / "blocks.json").write_text(json.dumps([b.replace(DOC_ADDRESS, snippet_server.address)
                                                      for b in blocks]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORTHOSERVE_")}
    out = subprocess.run([sys.executable, "-c", RUNNER, tmp_path / "blocks.json", doc], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stderr
    assert f"ran {len(blocks)} blocks" in out.stdout


def test_the_snippets_are_where_the_readers_look():
    # README.md's one python block is the "From Python" one.
    readme = (REPO / "README.md").read_text()
    [block] = python_blocks(REPO / "README.md")
    assert readme.index("From Python") < readme.index(block)
    assert len(python_blocks(REPO / "client" / "python" / "README.md")) >= 3
