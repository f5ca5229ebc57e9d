"""BucketServe client: Python API and CLI over tritonclient gRPC."""
