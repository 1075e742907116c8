"""orthoserve: Muon's Newton–Schulz orthogonalization as a remote computation.

    import orthoserve
    client = orthoserve.Client("127.0.0.1:50051")
    [u] = client.orthogonalize([g], precision="highest")

`orthoserve.torch` adds a newton_schulz callable and a Muon optimizer (requires torch).
"""

from orthoserve.client import DEFAULT_CHUNK_BYTES, Client, Group
from orthoserve.errors import *  # noqa: F401,F403
from orthoserve.errors import OrthoserveError
from orthoserve.layout import Shard, block_of, chunk_blocks, chunk_sizes

__version__ = "0.1.0"

__all__ = ["Client", "Group", "Shard", "OrthoserveError", "chunk_sizes", "chunk_blocks", "block_of",
           "DEFAULT_CHUNK_BYTES", "__version__"]
