"""BucketServe client: Python API and CLI over tritonclient gRPC."""

from bucketserve_client.aio import AsyncClient
from bucketserve_client.client import Client
from bucketserve_client.params import MODELS, GenerationParams
from bucketserve_client.response import Chunk, Completion, GenerationError

__all__ = [
    "AsyncClient",
    "Chunk",
    "Client",
    "Completion",
    "GenerationError",
    "GenerationParams",
    "MODELS",
]
