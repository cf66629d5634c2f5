"""Benchmark: the CPU one API request costs pykcm's RestClient, this checkout against others.

Not a test: a script that prints a table. On one freshly started local control plane, a child
process per checkout (this one and each --against directory, e.g. an export of main) sends
--requests GETs of one ConfigMap and as many POSTs creating ConfigMaps, one at a time and then
--in-flight at once, on uvloop, and reports time.process_time() per request. The children take
turns, --runs times each, so a busy machine slows them alike; the table has the medians. Each
child deletes its ConfigMaps and then its namespace at the end, which it finalizes itself (no
namespace controller runs here); the cluster's directory is removed at the end of the run.
Run: python tests/bench/bench_requests.py [--against /tmp/pykcm-main --requests 2000 --in-flight 32 --runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

CHILD_TIMEOUT = 900.0
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
        # No namespace controller runs on this cluster: the child empties its namespace and
        # finalizes it itself, so the next child starts on the same etcd contents. Plain requests:
        # an older checkout's RestClient may lack the helpers.
        namespace = NAMESPACES.path(None, ns)
        await client.request("DELETE", CONFIGMAPS.path(ns))
        await client.request("DELETE", namespace)
        body = await client.request("GET", namespace)
        body["spec"]["finalizers"] = []
        await client.request("PUT", f"{namespace}/finalize", body=body)
        await client.close()


def child_main(args: argparse.Namespace) -> None:
    from pykcm.app import eventloop

    figures = eventloop.run(measure(args.kubeconfig, args.requests, args.in_flight), use_uvloop=True)
    print(json.dumps(figures))


class ChildFailed(Exception):
    """A child measuring one checkout failed; the message is the tail of its stderr."""


def run_child(checkout: Path, kubeconfig: Path, args: argparse.Namespace) -> dict[str, float]:
    argv = [sys.executable, __file__, "--child", "--kubeconfig", str(kubeconfig),
            "--requests", str(args.requests), "--in-flight", str(args.in_flight)]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ChildFailed(f"the child for {checkout} did not finish within {CHILD_TIMEOUT:.0f}s") from None
    if done.returncode != 0:
        tail = " | ".join(line.strip() for line in done.stderr.strip().splitlines()[-3:])
        raise ChildFailed(f"the child for {checkout} exited with {done.returncode}: {tail[-400:]}")
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", action="append", default=[], metavar="DIR",
                        help="another checkout to compare (its pykcm/ is imported); may be repeated")
    parser.add_argument("--requests", type=int, default=2000, help="requests of each case (at least --in-flight)")
    parser.add_argument("--in-flight", type=int, default=32, help="N: requests in flight at once in the N cases")
    parser.add_argument("--runs", type=int, default=5, help="runs of each checkout; the table has their medians")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return
    if min(args.in_flight, args.runs) < 1 or args.requests < args.in_flight:
        parser.error("--in-flight and --runs must be positive, and --requests at least --in-flight")
    repo = Path(__file__).resolve().parents[2]
    checkouts = [repo, *(Path(p).resolve() for p in args.against)]
    for checkout in checkouts:
        if not (checkout / "pykcm" / "__init__.py").is_file():
            parser.error(f"--against {checkout}: no pykcm/ there to import")
    sys.path.insert(0, str(repo))
    from pykcm.testenv.cluster import running
    from tests.bench.common import one_line_failures, scratch_directory

    def measure_all() -> None:
        with scratch_directory("pykcm-bench-requests-") as root, \
                running(root / "cluster", log=lambda m: print(f"[testenv] {m}")) as plane:
            for run in range(args.runs):
                for checkout in checkouts:
                    print(f"[bench] run {run + 1}/{args.runs}: {checkout} ...", flush=True)
                    try:
                        results[checkout].append(run_child(checkout, plane.kubeconfig, args))
                    except ChildFailed as err:
                        print(f"[bench] failed: {err}", file=sys.stderr)
                        sys.exit(1)

    results: dict[Path, list[dict[str, float]]] = {c: [] for c in checkouts}
    one_line_failures(measure_all)
    print(f"\nCPU per request (µs, median of {args.runs} runs of {args.requests}; N = {args.in_flight})")
    print(f"{'case':<20}" + "".join(f"{c.name[:18]:>20}" for c in checkouts))
    for case in CASES:
        medians = [statistics.median(r[case] for r in results[c]) for c in checkouts]
        print(f"{case:<20}" + "".join(f"{m:>20.0f}" for m in medians))


if __name__ == "__main__":
    main()
