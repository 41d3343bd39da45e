"""What the gateway costs a request besides the model (docs/PERFORMANCE.md, section 2): HTTP, JSON, validation,
planning and the answer, with a scorer that answers at once.

    .venv/bin/python docs/experiments/gateway_overhead.py [--requests 25] [--strategies keyb2-blocks maxp]

The gateway (`create_app`, uvicorn, one worker) runs in this process on a free port with the prepared `models/`
pipeline and a scorer that returns zeros without computing; curl, a separate process, posts one body of 100
QMSum candidates of ~2k tokens (742 kB) again and again, so after the first request every document is cached
(the warm path). Printed per strategy: the median wall time curl saw (the first five requests left out) and
the server's own stage timings of the last answer.
"""

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, "service")

from keyrank.api.app import create_app  # noqa: E402
from keyrank.bench.workloads import candidate_documents  # noqa: E402
from keyrank.config import Settings  # noqa: E402
from keyrank.reranker import Reranker  # noqa: E402
from keyrank.scoring import Scores  # noqa: E402


class InstantScorer:
    """Zeros for every sequence (and zero pooled vectors where asked): the model costs nothing."""

    async def score(self, inputs, *, want_pooled: bool, deadline: float) -> Scores:
        n = len(inputs.ids)
        return Scores(np.zeros(n, np.float32), np.zeros((n, 384), np.float32) if want_pooled else None)

    async def ready(self, timeout: float) -> bool:
        return True

    async def close(self) -> None:
        pass


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=25)
    parser.add_argument("--strategies", nargs="+", default=["keyb2-blocks", "maxp"])
    args = parser.parse_args()
    # Admission's drain rate set high: the instant scorer would otherwise be charged the CPU model's 4 sequences/s.
    settings = Settings(model_dir=Path("models"), triton_url="unused", capacity_sequences_per_s=1e6)
    reranker = Reranker(settings, scorer=InstantScorer())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings, reranker=reranker), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    pool, queries = candidate_documents(Path("../shared/datasets"), reranker.tokenizer, 100)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for strategy in args.strategies:
                body, answer = Path(tmp) / "body.json", Path(tmp) / "answer.json"
                body.write_text(json.dumps({"query": queries[0], "documents": pool, "strategy": strategy}))
                seconds = []
                for _ in range(args.requests):
                    out = subprocess.run(["curl", "-s", "-o", str(answer), "-w", "%{time_total} %{http_code}", "-H",
                                          "content-type: application/json", "--data-binary", f"@{body}",
                                          f"http://127.0.0.1:{port}/rerank"], capture_output=True, text=True, check=True).stdout
                    took, code = out.split()
                    if code != "200":
                        sys.exit(f"{strategy}: HTTP {code}: {answer.read_text()[:300]}")
                    seconds.append(float(took))
                timings = json.loads(answer.read_text())["timings_ms"]
                print(f"{strategy:<14} {body.stat().st_size:,} bytes  curl p50 {statistics.median(seconds[5:]) * 1e3:6.1f} ms  "
                      f"server stages {timings}")
    finally:
        server.should_exit = True


if __name__ == "__main__":
    main()
