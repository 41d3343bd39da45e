"""What scores a model is reported as it is (api/served.py): GET /v1/models gives each served model's runtime,
precision and device, and GET /tei/info's ``model_dtype`` is the default model's precision, from the runtime
`keyrank prepare` chose and this machine runs (OpenVINO bf16 where the CPU has bfloat16), never a constant.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prepared_variants import as_variant

from keyrank.api import create_app
from keyrank.api.served import Served, embedded_cpu, from_triton_config, in_process
from keyrank.config import Settings
from keyrank.scoring import openvino

DEAD_TRITON = "127.0.0.1:1"


def _here(precision: str) -> str:
    """What OpenVINO computes ``precision`` in on this CPU, in TEI's names."""
    return {"bf16": "bfloat16", "f32": "float32"}[openvino.precision_here(precision)]


@pytest.fixture(scope="module")
def bf16_models(prepared_models, tmp_path_factory) -> Path:
    """The real model as `keyrank prepare`'s default serves it where the CPU has bf16: openvino-bf16."""
    return as_variant(prepared_models, tmp_path_factory.mktemp("served") / "bf16", "openvino-bf16",
                       {"runtime": "openvino", "precision": "bf16"})


def _discovery(model_dir: Path, **settings) -> tuple[dict, dict]:
    """GET /v1/models' card and GET /tei/info of a gateway on ``model_dir``'s embedded repository (no Triton
    needs to run: what serves is read from the repository, as the embedded Triton's model reads it)."""
    s = Settings(model_dir=model_dir, triton_url=DEAD_TRITON, triton_connect_timeout_s=0.5, **settings)
    with TestClient(create_app(s)) as client:
        models, info = client.get("/v1/models"), client.get("/tei/info")
    assert models.status_code == 200 and info.status_code == 200, (models.text, info.text)
    return models.json()["data"][0], info.json()


def test_tei_info_and_v1_models_report_openvino_bf16_where_it_serves(bf16_models):
    card, info = _discovery(bf16_models, triton_server_id="keyrank-test")
    assert (card["runtime"], card["precision"], card["device"]) == ("openvino", _here("bf16"), "cpu")
    assert info["model_dtype"] == _here("bf16")
    if openvino.bf16_supported():  # the default's case on this CPU: bf16 scores, and the info says so
        assert info["model_dtype"] == "bfloat16"


def test_a_fused_onnxruntime_model_reports_float32(prepared_models):
    card, info = _discovery(prepared_models, triton_server_id="keyrank-test")
    assert (card["runtime"], card["precision"], card["device"], info["model_dtype"]) == ("onnxruntime", "float32", "cpu", "float32")


def test_an_external_triton_that_does_not_answer_is_unknown_not_guessed(bf16_models):
    card, info = _discovery(bf16_models)
    assert (card["runtime"], card["precision"], info["model_dtype"]) == ("unknown", "unknown", "unknown")


def test_the_embedded_reading_falls_back_as_the_model_does(bf16_models, tmp_path, monkeypatch):
    settings = Settings(model_dir=bf16_models)
    monkeypatch.setattr(openvino, "bf16_supported", lambda: False)
    assert embedded_cpu(settings) == Served("openvino", "float32", "cpu")  # no bf16 on this CPU: f32
    monkeypatch.setattr(openvino, "available", lambda: False)
    assert embedded_cpu(settings) == Served("onnxruntime", "float32", "cpu")  # OpenVINO missing: ONNX Runtime
    int8 = as_variant(bf16_models, tmp_path / "int8", "int8", None)
    assert embedded_cpu(Settings(model_dir=int8)) == Served("onnxruntime", "int8", "cpu")


def test_the_embedded_reading_agrees_with_what_the_in_process_scorer_opens(bf16_models):
    """Reranker.local opens the same model.onnx on the runtime runtime.json names: the report matches it."""
    from keyrank import Reranker

    reranker = Reranker.local(bf16_models)
    try:
        assert in_process(reranker.scorer, reranker.settings) == embedded_cpu(reranker.settings)
    finally:
        reranker.close()


def test_an_external_tritons_config_is_read_for_backend_device_and_tensorrt_precision(bf16_models):
    settings = Settings(model_dir=bf16_models)
    gpu = {"backend": "onnxruntime", "instance_group": [{"count": 1, "kind": "KIND_GPU"}]}
    assert from_triton_config(gpu, settings) == Served("onnxruntime", "float32", "cuda")
    trt = {**gpu, "optimization": {"execution_accelerators": {"gpu_execution_accelerator": [
        {"name": "tensorrt", "parameters": {"precision_mode": "FP16", "max_workspace_size_bytes": "1073741824"}}]}}}
    assert from_triton_config(trt, settings) == Served("tensorrt", "float16", "cuda")
    # The CPU Triton image serves the embedded repository in the Python backend: read as the embedded one.
    assert from_triton_config({"backend": "python", "instance_group": [{"kind": "KIND_CPU"}]}, settings) == embedded_cpu(settings)


@pytest.mark.triton
def test_a_real_embedded_triton_is_reported_from_its_repository(prepared_models, embedded_triton):
    """The config a running embedded Triton holds reads as the repository says, and a gateway told it is that
    server (as `keyrank serve` is) reports the same."""
    settings = Settings(model_dir=prepared_models)
    config = embedded_triton.admin.config("cross_encoder")
    assert config is not None and from_triton_config(config, settings) == embedded_cpu(settings)
    card, _ = _discovery(prepared_models, triton_server_id=embedded_triton.server_id)
    assert Served(card["runtime"], card["precision"], card["device"]) == embedded_cpu(settings)


# --- keyrank_model_info -----------------------------------------------------------------------------------------


def _model_info(text: str) -> dict[str, dict[str, str]]:
    """/metrics' ``keyrank_model_info`` samples: {model: {runtime, precision, device}}."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, dict[str, str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "keyrank_model_info":
                assert sample.value == 1.0
                labels = dict(sample.labels)
                found[labels.pop("model")] = labels
    return found


def _metrics(app) -> tuple[dict, dict[str, dict[str, str]]]:
    """GET /v1/models' cards by id and /metrics' keyrank_model_info of ``app`` once started (no route asked
    before /metrics: startup set it)."""
    with TestClient(app) as client:
        metrics = client.get("/metrics")
        assert metrics.status_code == 200, metrics.text
        info = _model_info(metrics.text)
        cards = {card["id"]: card for card in client.get("/v1/models").json()["data"]}
    return cards, info


def test_model_info_metric_reports_the_embedded_models_runtime_per_served_model(bf16_models, prepared_models):
    """Two models side by side (the default's OpenVINO bf16 variant and a fused ONNX Runtime one): one
    ``keyrank_model_info`` sample each, set at startup, equal to what /v1/models says."""
    s = Settings(models=f"ov={bf16_models},ort={prepared_models}", triton_url=DEAD_TRITON,
                 triton_connect_timeout_s=0.5, triton_server_id="keyrank-test")
    cards, info = _metrics(create_app(s))
    assert info == {
        "ov": {"runtime": "openvino", "precision": _here("bf16"), "device": "cpu"},
        "ort": {"runtime": "onnxruntime", "precision": "float32", "device": "cpu"},
    }
    assert info == {name: {k: card[k] for k in ("runtime", "precision", "device")} for name, card in cards.items()}


def test_model_info_metric_reports_an_in_process_scorer(bf16_models):
    from keyrank import Reranker

    reranker = Reranker.local(bf16_models)
    try:
        _, info = _metrics(create_app(reranker.settings, reranker=reranker))
        expected = in_process(reranker.scorer, reranker.settings)
    finally:
        reranker.close()
    assert list(info.values()) == [expected.as_dict()]
    assert expected.runtime == "openvino" and expected.precision == _here("bf16")


def test_model_info_metric_says_unknown_for_an_external_triton_that_does_not_answer(bf16_models):
    s = Settings(model_dir=bf16_models, triton_url=DEAD_TRITON, triton_connect_timeout_s=0.5, model_name="m")
    _, info = _metrics(create_app(s))
    assert info == {"m": {"runtime": "unknown", "precision": "unknown", "device": "unknown"}}


@pytest.mark.triton
def test_model_info_metric_of_a_gateway_on_a_real_embedded_triton(prepared_models, embedded_triton):
    """A gateway on the running embedded Triton (as `keyrank serve` starts it) exports what scores its model."""
    s = Settings(model_dir=prepared_models, triton_url=embedded_triton.grpc_url, triton_server_id=embedded_triton.server_id)
    cards, info = _metrics(create_app(s))
    assert list(info.values()) == [embedded_cpu(s).as_dict()]
    assert list(info) == list(cards)
