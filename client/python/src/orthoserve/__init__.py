"""orthoserve: Muon's Newton–Schulz orthogonalization as a remote computation.

    import orthoserve
    client = orthoserve.Client("127.0.0.1:50051")
    [u] = client.orthogonalize([g], precision="highest")

Calls retry UNAVAILABLE (and ABORTED marked as a fleet change, and attempts that ran out of their timeout, 90 s by
default) under an orthoserve.RetryPolicy. Group steps carry
their run's id (orthoserve.runs: run_id=, ORTHOSERVE_RUN_ID, TORCHELASTIC_RUN_ID or agreed over torch.distributed),
and every result is checked against what was sent (orthoserve.IntegrityError otherwise).
`orthoserve.torch` adds a newton_schulz callable and a Muon optimizer (requires torch).
"""

from orthoserve import runs
from orthoserve.client import (DEFAULT_CHUNK_BYTES, DEFAULT_KEEPALIVE_TIME, DEFAULT_KEEPALIVE_TIMEOUT, DEFAULT_TIMEOUT,
                               ND_MODES, Client, Group)
from orthoserve.errors import *  # noqa: F401,F403
from orthoserve.errors import IntegrityError, OrthoserveError
from orthoserve.layout import Shard, block_of, chunk_blocks, chunk_sizes
from orthoserve.retry import RetryPolicy

__version__ = "0.1.0"

__all__ = ["Client", "Group", "Shard", "RetryPolicy", "OrthoserveError", "IntegrityError", "runs", "chunk_sizes",
           "chunk_blocks", "block_of", "DEFAULT_CHUNK_BYTES", "DEFAULT_TIMEOUT", "DEFAULT_KEEPALIVE_TIME",
           "DEFAULT_KEEPALIVE_TIMEOUT", "ND_MODES", "__version__"]
