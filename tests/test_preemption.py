"""A cancelled run never breaks the runtime for the next ones: on the default CPU variant (OpenVINO bf16
where the CPU has it) and on ONNX Runtime, a batch cancelled while it runs, in every order of shapes
(larger after smaller, smaller after larger, the same), leaves every later run of every shape with the
scores it has uncancelled.

OpenVINO 2026.4's CPU plugin broke here: ``InferRequest.cancel`` inside a [8, 512] run after a [3, 128]
one made the next [3, 128] runs fail ("Failed to broadcast-merge input shapes") until a third shape ran;
the embedded model now stops OpenVINO only between slices (python_models/model.py, OPENVINO_RUN_TOKENS).

Real parts only: the real cross-encoder, a real tritonserver, real gRPC cancellation."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from keyrank.scoring import openvino
from shared_data import CE_MODEL, grpc_inputs, linked_copy

pytestmark = pytest.mark.triton

SHAPES = [(3, 128), (8, 512), (2, 64)]
"""Small, large (several slices: ~0.4 s on 2 cores) and tiny batches."""


@pytest.fixture(scope="module")
def default_variant_triton(prepared_models, tmp_path_factory):
    """An embedded Triton on what `keyrank prepare` serves by default here (openvino-bf16 where the CPU has bf16)."""
    from keyrank.config import Settings
    from keyrank.modelserver.embedded import EmbeddedTriton
    from keyrank.prepare.export import prepare

    out = linked_copy(prepared_models, tmp_path_factory.mktemp("default") / "models")
    prepare(str(CE_MODEL), out)
    settings = Settings(model_dir=out, embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0)
    with EmbeddedTriton(settings=settings) as server:
        yield server


def _inputs(rows: int, width: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 20000, size=(rows, width), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return grpc_inputs(ids)


def _cancel_every_order(server) -> tuple[list[str], list[str]]:
    """For each (shape run before, shape cancelled mid-run): the runs of every shape that followed and failed or
    scored otherwise than uncancelled; and the cancellations that did cancel (not answered before the cancel)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url.removeprefix("grpc://"))
    model = server.model
    score = lambda shape: client.infer(model, _inputs(*shape, seed=shape[0] * shape[1])).as_numpy("logits")
    reference = {shape: score(shape) for shape in SHAPES}
    broken, cancelled = [], []
    for before, victim in itertools.product(SHAPES, SHAPES):
        score(before)
        try:
            client.infer(model, _inputs(*victim, seed=7), client_timeout=0.03)
        except Exception as exc:  # noqa: BLE001 -- the deadline we asked for
            assert "deadline" in str(exc).lower() or "cancel" in str(exc).lower(), exc
            cancelled.append(f"{victim} after {before}")
        time.sleep(0.05)
        for after in SHAPES:
            try:
                got = score(after)
            except Exception as exc:  # noqa: BLE001 -- what the test is about
                broken.append(f"{after} after cancelling {victim} (run after {before}): {str(exc)[:120]}")
                continue
            if not np.allclose(got, reference[after], atol=1e-3):
                broken.append(f"{after} after cancelling {victim} (run after {before}): max diff "
                              f"{np.abs(got - reference[after]).max():.4f}")
    client.close()
    return broken, cancelled


def test_a_cancelled_run_of_any_shape_leaves_every_later_run_correct_on_the_default_variant(default_variant_triton):
    broken, cancelled = _cancel_every_order(default_variant_triton)
    assert not broken, broken
    assert any("(8, 512)" in c for c in cancelled), cancelled  # the large batch was cancelled while it ran


def test_a_cancelled_run_of_any_shape_leaves_every_later_run_correct_on_onnxruntime(embedded_triton):
    broken, cancelled = _cancel_every_order(embedded_triton)
    assert not broken, broken
    assert any("(8, 512)" in c for c in cancelled), cancelled


@pytest.mark.skipif(not openvino.bf16_supported(), reason="the default variant is OpenVINO bf16 only where the CPU has bf16")
def test_the_default_variant_here_is_openvino(default_variant_triton):
    version = default_variant_triton.settings.model_dir / "triton-embedded/cross_encoder/1"
    assert openvino.read_runtime(version) == {"runtime": "openvino", "precision": "bf16"}
