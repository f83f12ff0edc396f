"""What one Ray Serve hop costs on this machine, without a model: the floor under ``ortpilot serve``.

A local Ray instance (2 CPUs, no dashboard) and one application whose ingress either answers
itself (``/one``: HTTP proxy -> ingress replica) or first awaits a trivial method of a second
deployment through its handle (``/two``: proxy -> ingress -> model replica, the path an
``ortpilot serve`` infer request takes). One keep-alive client, requests interleaved in blocks.

    flock -x /tmp/ortpilot-cpu.lock .venv-test/bin/python benchmarks/bench_ray_hops.py [--requests 400]
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()
    import ray
    from ray import serve
    from starlette.responses import Response

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    quiet = {"log_level": "WARNING", "enable_access_log": False}
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        logging_level="WARNING",
    )
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config=quiet)

        @serve.deployment(ray_actor_options={"num_cpus": 1})
        class Model:
            async def f(self, x: int) -> int:
                return x

        @serve.deployment(ray_actor_options={"num_cpus": 0})
        class Ingress:
            def __init__(self, model) -> None:
                self.model = model

            async def __call__(self, request) -> Response:
                if request.url.path == "/two":
                    await self.model.f.remote(1)
                return Response(b"ok")

        serve.run(Ingress.bind(Model.bind()), name="hops", route_prefix="/", logging_config=quiet)
        conn = http.client.HTTPConnection("127.0.0.1", port)
        times: dict[str, list[float]] = {"/one": [], "/two": []}
        for path in times:  # warmup
            for _ in range(50):
                conn.request("GET", path)
                conn.getresponse().read()
        for block in range(args.requests // 50):
            for path in ("/one", "/two") if block % 2 == 0 else ("/two", "/one"):
                for _ in range(25):
                    t0 = time.perf_counter()
                    conn.request("GET", path)
                    conn.getresponse().read()
                    times[path].append(time.perf_counter() - t0)
        one, two = (statistics.median(times[p]) * 1000 for p in ("/one", "/two"))
        print(f"load average {os.getloadavg()[0]:.2f}; {len(times['/one'])} requests each")
        print(
            f"proxy -> ingress: p50 {one:.2f} ms; proxy -> ingress -> model: p50 {two:.2f} ms; "
            f"the second hop: {two - one:.2f} ms"
        )
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
