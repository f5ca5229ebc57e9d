"""`python -m bucketserve.serving.openai --run-config RUN/run_config.json --port 9000`."""

from __future__ import annotations

import argparse
import asyncio

import uvicorn

from bucketserve.serving.config import ServeConfig
from bucketserve.serving.model_info import load_tokenizer, model_info


async def serve(cfg: ServeConfig, host: str, port: int) -> None:
    import tritonclient.grpc.aio as grpcaio

    from bucketserve.serving.front.grpc_mux import StreamPool
    from bucketserve.serving.openai.app import Settings, create_app

    client = grpcaio.InferenceServerClient(f"{cfg.host}:{cfg.grpc_port}")
    pool = StreamPool(f"{cfg.host}:{cfg.grpc_port}")
    await pool.open()
    settings = Settings(
        grpc_url=f"{cfg.host}:{cfg.grpc_port}",
        metrics_url=f"http://{cfg.host}:{cfg.metrics_port}/metrics",
        model=cfg.model,
        tokenizer=load_tokenizer(model_info(cfg)),
    )
    app = create_app(settings, client, pool, cfg.max_concurrent_requests)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    try:
        await server.serve()
    finally:
        await pool.close()
        await client.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="bucketserve-openai", description=__doc__)
    p.add_argument("--run-config", required=True, help="run_config.json of the Triton server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000)
    a = p.parse_args(argv)
    asyncio.run(serve(ServeConfig.read(a.run_config), a.host, a.port))


if __name__ == "__main__":
    main()
