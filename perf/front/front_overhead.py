"""The HTTP front's own cost per streamed event, without a model (so CPU noise from the model
does not drown it): an upstream process speaking Triton's gRPC protocol streams responses whose
text is their send time, one every `--interval-ms`; a client reads them direct (gRPC streaming,
as `tritonclient` users do) and through a Front (HTTP generate_stream, which the front relays
over gRPC), interleaved, and reports the delivery delay (arrival - send) per event for each path.

  perf/front/front_overhead.py --events 400 --streams 8 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

import httpx
import numpy as np
import tritonclient.grpc.aio as grpcaio
from bucketserve.serving.launch.serve_process import free_port
from tritonclient.grpc import InferInput

UPSTREAM = """
import queue, sys, threading, time
from concurrent import futures
import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
n, interval = int(sys.argv[2]), float(sys.argv[3])
def response(i, rid):
    r = service_pb2.ModelInferResponse(model_name="m", model_version="1", id=rid)
    for name, value in (("text_output", repr(time.time())),
                        ("finish_reason", "length" if i == n - 1 else "")):
        r.outputs.add(name=name, datatype="BYTES", shape=[1])
        r.raw_output_contents.append(len(value).to_bytes(4, "little") + value.encode())
    r.parameters["triton_final_response"].bool_param = i == n - 1
    return service_pb2.ModelStreamInferResponse(infer_response=r)
def generation(rid, send):
    for i in range(n):
        send(response(i, rid))
        time.sleep(interval)
class Service(service_pb2_grpc.GRPCInferenceServiceServicer):
    def ModelMetadata(self, request, context):
        meta = service_pb2.ModelMetadataResponse(name="m", versions=["1"])
        meta.inputs.add(name="text_input", datatype="BYTES", shape=[1])
        return meta
    def ModelStreamInfer(self, requests, context):  # many requests per stream, as Triton
        out = queue.Queue()
        def read():
            try:
                for req in requests:
                    threading.Thread(target=generation, args=(req.id, out.put), daemon=True).start()
            except grpc.RpcError:
                pass
            out.put(None)
        threading.Thread(target=read, daemon=True).start()
        while (resp := out.get()) is not None:
            yield resp
server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Service(), server)
server.add_insecure_port(f"127.0.0.1:{sys.argv[1]}")
server.start()
server.wait_for_termination()
"""


FRONT = """
import sys, time
from bucketserve.serving.front.allowlist import AccessPolicy
from bucketserve.serving.front.app import Front
from bucketserve.serving.front.health import READY, Health
from bucketserve.serving.front.metrics import FrontMetrics
from bucketserve.serving.front.server import FrontServer
health = Health()
health.set(READY, upstream="http://127.0.0.1:9")  # only generate is asked for: never used
# the stand-in model "m" is not one of ours: no allow-list
front = Front(health, FrontMetrics(), 1 << 22, sys.argv[2], policy=AccessPolicy(public_models=None))
FrontServer(front, "127.0.0.1", int(sys.argv[1])).start()
time.sleep(3600)
"""


async def read_sse(client: httpx.AsyncClient, url: str) -> list[float]:
    delays = []
    async with client.stream("POST", url, json={"text_input": "x"}) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                delays.append(time.time() - float(json.loads(line[6:])["text_output"]))
    return delays


async def read_grpc(client: grpcaio.InferenceServerClient) -> list[float]:
    t = InferInput("text_input", [1], "BYTES")
    t.set_data_from_numpy(np.array([b"x"], dtype=np.object_))

    async def requests():
        yield {"model_name": "m", "inputs": [t]}
        await asyncio.sleep(3600)  # the stream stays open until the last response

    delays, call = [], client.stream_infer(requests())
    async for result, _ in call:
        delays.append(time.time() - float(result.as_numpy("text_output")[0]))
        if result.as_numpy("finish_reason")[0]:
            break
    call.cancel()
    return delays


async def round_of(path: str, target: str, streams: int) -> list[float]:
    if path == "front":
        async with httpx.AsyncClient(timeout=60) as client:
            url = f"http://{target}/v2/models/m/generate_stream"
            results = await asyncio.gather(*(read_sse(client, url) for _ in range(streams)))
    else:
        client = grpcaio.InferenceServerClient(target)
        try:
            results = await asyncio.gather(*(read_grpc(client) for _ in range(streams)))
        finally:
            await client.close()
    return [d for r in results for d in r]


def ms(xs: list[float], q: int) -> float:
    return statistics.quantiles(xs, n=100)[q - 1] * 1000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--events", type=int, default=400)
    p.add_argument("--interval-ms", type=float, default=5.0)
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    up_port, front_port = free_port(), free_port()
    up = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up_port), str(a.events),
                           str(a.interval_ms / 1000)])  # fmt: skip
    upstream = f"127.0.0.1:{up_port}"
    # the front in its own process, as in `bucketserve serve` (not sharing the client's GIL)
    front = subprocess.Popen([sys.executable, "-c", FRONT, str(front_port), upstream])
    try:
        time.sleep(3.0)
        paths = {"direct": upstream, "front": f"127.0.0.1:{front_port}"}
        for name, target in paths.items():  # warm-up, untimed
            asyncio.run(round_of(name, target, 2))
        res: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(a.rounds):
            for name, target in paths.items():
                res[name] += asyncio.run(round_of(name, target, a.streams))
    finally:
        front.kill()
        up.kill()
    for name, d in res.items():
        print(f"{name:6s} delivery delay p50 {ms(d, 50):6.3f} ms  p90 {ms(d, 90):6.3f} ms"
              f"  p99 {ms(d, 99):6.3f} ms  (events={len(d)})")  # fmt: skip
    print(f"front adds p50 {ms(res['front'], 50) - ms(res['direct'], 50):+.3f} ms,"
          f" p90 {ms(res['front'], 90) - ms(res['direct'], 90):+.3f} ms per event")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
