"""The CUDA device a thread works on. CUDA's current device is per thread and defaults to 0:
torch ops follow their tensors, but Triton launches (and CUDA-graph capture) use the current
device, so every engine entry point and thread runs inside its runner's device."""

from __future__ import annotations

import contextlib

import torch


def device_context(device: torch.device):
    """Make `device` current for the block (a no-op off CUDA)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def bind_thread(device: torch.device) -> None:
    """Make `device` this thread's current CUDA device (a no-op off CUDA)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
