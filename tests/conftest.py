"""Session fixtures shared by the test modules: the real exported models and one
embedded Triton serving them (started once, on free loopback ports)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings
from keyrank import cores
from shared_data import CE_MODEL, REPO

# Generated tests (hypothesis, schemathesis) draw the same examples on every run: a failure in CI
# is a failure on every machine, never a random one. A failure found is kept as an explicit case.
hypothesis_settings.register_profile("keyrank", derandomize=True, database=None, print_blob=True)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "keyrank"))

# --- settings ------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def settings_of_the_environment():
    """Every test reads ``get_settings()`` from the environment as it is: the cache is cleared after each test,
    once monkeypatch has put the environment back (autouse fixtures are set up first, so torn down last). A test
    that set KEYRANK_* variables and read the settings under them hands them to no later test."""
    from keyrank.config import get_settings

    yield
    get_settings.cache_clear()


# --- prepared_models ---------------------------------------------------------------------


@pytest.fixture(scope="session")
def prepared_models() -> Path:
    """`keyrank prepare` of the real cross-encoder (and bi-encoder) into the repository's models-test/.

    Idempotent: the first test run exports (~30 s), later ones only verify fingerprints (<1 s).
    ``KEYRANK_TEST_MODEL_DIR`` points the tests at another directory (prepared there if needed).
    Not models/: that is what `make run` serves, prepared with the CPU variant `auto` picks, and a test
    run must not change it.
    """
    if not CE_MODEL.is_dir():
        pytest.skip(f"real cross-encoder not found at {CE_MODEL}")
    from keyrank.prepare.export import prepare

    out = Path(os.environ.get("KEYRANK_TEST_MODEL_DIR", REPO / "models-test"))
    # The fused CPU variant, which computes fp32's function: the suite compares scores with fp32 references
    # (golden scores, sentence-transformers) at 1e-4. The default on a bf16 CPU, openvino-bf16, has its
    # own tests (test_openvino.py).
    # KEYRANK_TEST_BI_ENCODER=none: without the bi-encoder's package (the GPU machine's run of the CUDA tests,
    # docs/experiments/gpu_run.sh); the tests of the dense selector then skip or fail, the others do not need it.
    bi_encoder = None if os.environ.get("KEYRANK_TEST_BI_ENCODER") == "none" else "auto"
    prepare(str(CE_MODEL), out, cpu_variant="fused", bi_encoder=bi_encoder)
    return out


# --- mixed_inputs / mixed_fp32 ------------------------------------------------------------------


@pytest.fixture(scope="session")
def mixed_inputs(prepared_models: Path):
    """Real model inputs of very different lengths (DL20 passages, short, and joined passages, long): what the
    GPU variants' tests score on the CPU."""
    from shared_data import mixed_length_inputs

    return mixed_length_inputs(prepared_models)


@pytest.fixture(scope="session")
def mixed_fp32(prepared_models: Path, mixed_inputs):
    """``mixed_inputs`` scored by the fp32 ONNX export in-process: the reference of those tests."""
    from keyrank.modelserver.repository import MODEL_NAME
    from keyrank.scoring.local import LocalScorer

    onnx = prepared_models / "triton" / MODEL_NAME / "1" / "model.onnx"
    return LocalScorer(onnx, pad_id=0, buckets=[64, 128, 256, 384, 512], threads=2).score_sync(mixed_inputs, want_pooled=True)


# --- embedded_triton ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def embedded_triton(prepared_models: Path):
    """The real tritonserver on models/triton-embedded, ready; stopped (no orphans) at the end.

    Tests that kill it must leave it restarted (``restart()`` keeps the ports and grpc_url).
    """
    from keyrank.config import Settings
    from keyrank.modelserver.embedded import EmbeddedTriton

    settings = Settings(
        model_dir=Path(prepared_models), embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0
    )
    with EmbeddedTriton(settings=settings) as server:
        yield server


# --- reranker ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def reranker(prepared_models: Path, embedded_triton):
    """The Python API on the session's Triton."""
    from keyrank.config import Settings
    from keyrank.reranker import Reranker

    # A generous deadline: these tests pin rankings, not latency, and must hold on a loaded machine.
    reranker = Reranker(Settings(model_dir=Path(prepared_models), triton_url=embedded_triton.grpc_url, request_timeout_s=300))
    yield reranker
    reranker.close()


# --- gateway_url ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def gateway_url(prepared_models: Path, embedded_triton):
    """A real uvicorn gateway (real HTTP on a free loopback port) over the session's Triton."""
    with serve_gateway(prepared_models, embedded_triton.grpc_url) as url:
        yield url


@contextlib.contextmanager
def serve_gateway(model_dir: Path, triton_url: str, **settings):
    """A real uvicorn gateway on a free loopback port over ``triton_url``, with ``settings`` overriding the
    defaults; yields its URL and stops it on exit."""
    import socket
    import threading
    import time

    import httpx
    import uvicorn
    from keyrank.api import create_app
    from keyrank.config import Settings

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = Settings(model_dir=Path(model_dir), triton_url=triton_url, port=port, **settings)
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            pytest.fail("gateway did not start")
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=15)


# --- machine: the cores this process sees -----------------------------------------------


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """``machine(count, cpu_max=None)``: this process sees ``count`` cores in its affinity and the container CPU limit
    ``cpu_max`` (cgroup v2's ``cpu.max`` text; None: no such file); RAYON_NUM_THREADS and
    ``KEYRANK_USABLE_CORES`` unset (keyrank/cores.py)."""
    limit = tmp_path / "cpu.max"
    monkeypatch.setattr(cores, "CGROUP_CPU_MAX", limit)
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    monkeypatch.delenv(cores.CORES_ENV, raising=False)

    def configure(count: int, cpu_max: str | None = None) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(count)))
        if cpu_max is None:
            limit.unlink(missing_ok=True)
        else:
            limit.write_text(cpu_max + "\n")

    return configure


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A tiny BERT built here and TREC files whose answers only keyb2 can read (toy_judged.py), per test module."""
    from toy_judged import tiny_bert, toy_trec

    root = tmp_path_factory.mktemp("toy")
    return {"root": root, "model": tiny_bert(root / "tiny-bert"), "trec": toy_trec(root)}
