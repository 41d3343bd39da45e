"""Peak and kept memory of the embedded model process (Triton's Python stub) after a burst of maxp
requests, per ``KEYRANK_EMBEDDED_RUN_TOKENS`` (docs/RELIABILITY.md, "Memory of the model process").

    python docs/experiments/stub_memory.py --models models --run-tokens 0 4096 2048

For each value, in turn: a fresh embedded Triton on ``<models>/triton-embedded``, warmed with one
request, then 30 maxp requests (2 documents of 200-1,200 words, 6 at a time, seed 0); prints the
stub's RSS before, its peak (VmHWM), its RSS after, and the burst's wall time.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

WORDS = "the committee met again to discuss the budget and the roads while the mayor chaired".split()


def _status_mb(pid: int, key: str) -> float:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith(key))
    return int(line.split()[1]) / 1024


def _stub(triton_pid: int) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if ppid == triton_pid and b"triton_python_backend_stub" in cmd:
                return int(entry.name)
    raise RuntimeError("no stub")


def measure(models: Path, run_tokens: int) -> dict:
    from keyrank.config import Settings
    from keyrank.modelserver.embedded import EmbeddedTriton
    from keyrank.reranker import Reranker

    os.environ["KEYRANK_EMBEDDED_RUN_TOKENS"] = str(run_tokens)  # the stub inherits tritonserver's environment
    settings = Settings(model_dir=models, embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0)
    rng = random.Random(0)
    bursts = [[" ".join(rng.choice(WORDS) for _ in range(rng.randint(200, 1200))) for _ in range(2)] for _ in range(30)]
    with EmbeddedTriton(settings=settings) as server:
        reranker = Reranker(Settings(model_dir=models, triton_url=server.grpc_url, request_timeout_s=600))
        try:
            reranker.rank("warm up", ["a short document"], strategy="maxp")
            stub = _stub(server.pid)
            before = _status_mb(stub, "VmRSS")
            started = time.perf_counter()
            with ThreadPoolExecutor(6) as pool:
                list(pool.map(lambda docs: reranker.rank("who chaired the budget meeting", docs, strategy="maxp"), bursts))
            seconds = time.perf_counter() - started
            return {"run_tokens": run_tokens, "rss_before_mb": before, "peak_mb": _status_mb(stub, "VmHWM"),
                    "rss_after_mb": _status_mb(stub, "VmRSS"), "burst_s": seconds}
        finally:
            reranker.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=Path, default=Path("models"), help="output of `keyrank prepare`")
    p.add_argument("--run-tokens", type=int, nargs="+", default=[0, 4096], help="values of KEYRANK_EMBEDDED_RUN_TOKENS")
    args = p.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| run tokens | RSS before | peak (VmHWM) | RSS after | burst |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for value in args.run_tokens:
        r = measure(args.models, value)
        print(f"| {value or 'one run per batch'} | {r['rss_before_mb']:.0f} MB | {r['peak_mb']:.0f} MB | "
              f"{r['rss_after_mb']:.0f} MB | {r['burst_s']:.1f} s |", flush=True)


if __name__ == "__main__":
    main()
