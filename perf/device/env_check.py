"""Step 1: the environment (versions, GPU, memory, which optional tools exist)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import shutil

import torch
from bucketserve.bench.device import emit, on_gpu


def _version(name: str, dist: str | None = None) -> str | None:
    """Installed version without importing the package (some imports take seconds)."""
    if importlib.util.find_spec(name) is None:
        return None
    try:
        return importlib.metadata.version(dist or name)
    except importlib.metadata.PackageNotFoundError:
        return "present"


def main() -> None:
    result = {
        "status": "ok", "python": platform.python_version(), "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "cuda_available": on_gpu(),
        "triton": _version("triton"), "transformers": _version("transformers"),
        "numpy": _version("numpy"), "flash_attn": _version("flash_attn"),
        "pytriton": _version("pytriton", "nvidia-pytriton"), "pytest": _version("pytest"),
        "tritonserver_on_path": shutil.which("tritonserver"),
    }  # fmt: skip
    if on_gpu():
        free, total = torch.cuda.mem_get_info()
        props = torch.cuda.get_device_properties(0)
        result.update(gpu=props.name, sms=props.multi_processor_count,
                      gpu_free_gib=round(free / 2**30, 1), gpu_total_gib=round(total / 2**30, 1))  # fmt: skip
    emit(result)


if __name__ == "__main__":
    main()
