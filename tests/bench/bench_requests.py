"""Benchmark: the CPU one API request costs pykcm's RestClient, this checkout against others.

Not a test: a script that prints a table. On one freshly started local control plane, a child
process per checkout (this one and each --against directory, e.g. an export of main) sends
--requests GETs of one ConfigMap and as many POSTs creating ConfigMaps, one at a time and then
--in-flight at once, on uvloop, and reports time.process_time() per request. The children take
turns, --runs times each, so a busy machine slows them alike; the table has the medians.
Run: python tests/bench/bench_requests.py --against /tmp/pykcm-main
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

CASES = ("GET, 1 in flight", "POST, 1 in flight", "GET, N in flight", "POST, N in flight")


async def measure(kubeconfig: str, requests: int, in_flight: int) -> dict[str, float]:
    """µs of CPU per request for each case, with whichever pykcm is on the path (the child's side)."""
    from pykcm.client.config import load_config
    from pykcm.client.resources import CONFIGMAPS, NAMESPACES
    from pykcm.client.rest import RestClient

    client = RestClient(load_config(kubeconfig).with_limits(100_000, 100_000), "bench-requests")
    ns = f"bench-{uuid.uuid4().hex[:8]}"
    await client.create(NAMESPACES, {"metadata": {"name": ns}})
    await client.create(CONFIGMAPS, {"metadata": {"name": "probe"}, "data": {"k": "v"}}, ns)
    names = iter(range(10**9))

    def get() -> object:
        return client.get(CONFIGMAPS, "probe", ns)

    def post() -> object:
        return client.create(CONFIGMAPS, {"metadata": {"name": f"c{next(names)}"}, "data": {"k": "v"}}, ns)

    async def timed(send: object, parallel: int) -> float:
        async def worker(count: int) -> None:
            for _ in range(count):
                await send()  # type: ignore[operator]

        await asyncio.gather(*(worker(20) for _ in range(parallel)))  # warm: connections open
        start = time.process_time()
        await asyncio.gather(*(worker(requests // parallel) for _ in range(parallel)))
        return (time.process_time() - start) / (requests // parallel * parallel) * 1e6

    try:
        return {
            CASES[0]: await timed(get, 1), CASES[1]: await timed(post, 1),
            CASES[2]: await timed(get, in_flight), CASES[3]: await timed(post, in_flight),
        }
    finally:
        await client.request("DELETE", NAMESPACES.path(None, ns))
        await client.close()


def child_main(args: argparse.Namespace) -> None:
    from pykcm.app import eventloop

    figures = eventloop.run(measure(args.kubeconfig, args.requests, args.in_flight), use_uvloop=True)
    print(json.dumps(figures))


def run_child(checkout: Path, kubeconfig: Path, args: argparse.Namespace) -> dict[str, float]:
    argv = [sys.executable, __file__, "--child", "--kubeconfig", str(kubeconfig),
            "--requests", str(args.requests), "--in-flight", str(args.in_flight)]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=900)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", action="append", default=[], help="another checkout to compare")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return
    repo = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(repo))
    from pykcm.testenv.cluster import running

    checkouts = [repo, *(Path(p).resolve() for p in args.against)]
    results: dict[Path, list[dict[str, float]]] = {c: [] for c in checkouts}
    with running(Path(tempfile.mkdtemp(prefix="pykcm-bench-")), log=lambda m: print(f"[testenv] {m}")) as plane:
        for run in range(args.runs):
            for checkout in checkouts:
                print(f"[bench] run {run + 1}/{args.runs}: {checkout} ...", flush=True)
                results[checkout].append(run_child(checkout, plane.kubeconfig, args))
    print(f"\nCPU per request (µs, median of {args.runs} runs of {args.requests}; N = {args.in_flight})")
    print(f"{'case':<20}" + "".join(f"{c.name[:18]:>20}" for c in checkouts))
    for case in CASES:
        medians = [statistics.median(r[case] for r in results[c]) for c in checkouts]
        print(f"{case:<20}" + "".join(f"{m:>20.0f}" for m in medians))


if __name__ == "__main__":
    main()
