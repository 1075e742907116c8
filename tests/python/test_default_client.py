"""A client generated from the .proto alone, with gRPC's default channel settings, against the real server.

Nothing of the orthoserve package is used: the stubs are compiled from proto/orthoserve/v1/orthogonalizer.proto
into a temporary directory and driven from a separate Python process (whose descriptor pool holds nothing
else), over a channel that keeps gRPC's default 4 MiB receive limit. The server's result messages must fit it
(StepHeader.result_chunk_bytes defaults to 4 MiB - 1 KiB), so a 64 MiB matrix streams through; a unary call
whose inline result is over 4 MiB is refused by the client's own limit, as the proto says.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import textwrap

from grpc_tools import protoc

REPO = pathlib.Path(__file__).resolve().parents[2]

CLIENT = textwrap.dedent(
    """
    import sys

    import grpc
    import numpy as np

    import orthogonalizer_pb2 as pb2
    import orthogonalizer_pb2_grpc as pb2_grpc

    rows, cols = 2048, 8192  # 64 MiB of fp32.
    g = np.random.default_rng(3).standard_normal((rows, cols), dtype=np.float32)
    data = g.tobytes()
    options = pb2.NsOptions(steps=0, precision=pb2.PRECISION_HIGHEST)
    spec = pb2.MatrixSpec(name="w", shape=[rows, cols], dtype=pb2.DTYPE_FP32, options=options)
    chunk = 1 << 20

    def requests():
        yield pb2.StreamRequest(header=pb2.StepHeader(num_matrices=1))
        yield pb2.StreamRequest(spec=spec)
        for offset in range(0, len(data), chunk):
            yield pb2.StreamRequest(chunk=pb2.DataChunk(index=0, data=data[offset:offset + chunk]))
        yield pb2.StreamRequest(end=pb2.StepEnd())

    with grpc.insecure_channel(sys.argv[1]) as channel:  # Default options: 4 MiB receive limit.
        stub = pb2_grpc.OrthogonalizerStub(channel)
        parts, results, summaries, largest = [], [], [], 0
        for response in stub.OrthogonalizeStream(requests(), timeout=120):
            kind = response.WhichOneof("kind")
            if kind == "result":
                results.append(response.result)
            elif kind == "chunk":
                parts.append(response.chunk.data)
                largest = max(largest, len(response.chunk.data))
            else:
                summaries.append(response.summary)
        assert [r.code for r in results] == [0], [r.message for r in results]
        assert len(summaries) == 1 and summaries[0].matrices_ok == 1, summaries
        assert largest <= (4 << 20) - 1024, largest
        out = np.frombuffer(b"".join(parts), dtype=np.float32).reshape(rows, cols)
        # steps = 0: the input over its Frobenius norm, times the spectral scale sqrt(max(rows, cols)).
        g64 = g.astype(np.float64)
        expected = (g64 / np.linalg.norm(g64) * np.sqrt(max(rows, cols))).astype(np.float32)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
        print(f"stream ok: {len(parts)} result chunks, largest {largest} bytes")

        # The unary call answers inline: an 8 MiB result exceeds this client's own receive limit.
        small = pb2.MatrixSpec(name="w", shape=[1024, 2048], dtype=pb2.DTYPE_FP32, options=options)
        try:
            stub.Orthogonalize(pb2.OrthogonalizeRequest(matrices=[pb2.Matrix(spec=small, data=data[:8 << 20])]),
                               timeout=120)
            raise SystemExit("the 8 MiB unary result was received despite the 4 MiB default limit")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
            print("unary over 4 MiB: RESOURCE_EXHAUSTED")
    """
)


def test_client_from_the_proto_alone_streams_a_64_mib_matrix(server, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    # At the root of its own include path, so that the generated modules are top-level; the wire names come
    # from the proto's package line.
    shutil.copy(REPO / "proto" / "orthoserve" / "v1" / "orthogonalizer.proto", src)
    gen = tmp_path / "gen"
    gen.mkdir()
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    rc = protoc.main(["protoc", f"-I{src}", f"-I{include}", f"--python_out={gen}", f"--grpc_python_out={gen}",
                      str(src / "orthogonalizer.proto")])
    assert rc == 0
    (gen / "client.py").write_text(CLIENT)
    run = subprocess.run([sys.executable, "client.py", server.address], cwd=gen, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "stream ok" in run.stdout and "RESOURCE_EXHAUSTED" in run.stdout, run.stdout
