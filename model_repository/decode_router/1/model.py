"""Triton entry point; all logic lives in bucketserve.serving.router_model."""

from bucketserve.serving.router_model import RouterModel as TritonPythonModel  # noqa: F401
