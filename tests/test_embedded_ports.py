"""Embedded Triton instances never share or mistake a server: free ports by default, a taken
configured port fails at once, the ready probe checks the server's id, and only health,
metadata and inference answer without the instance's admin key."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import numpy as np
import pytest
from keyrank.config import Settings
from keyrank.modelserver.embedded import (
    ADMIN_HEADER,
    GRPC_ADMIN_HEADER,
    EmbeddedTriton,
    EmbeddedTritonError,
)
from process_tree import BODY


def test_a_taken_configured_port_fails_at_once_naming_its_setting(prepared_models):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        with pytest.raises(EmbeddedTritonError, match=f"port {taken} \\(KEYRANK_EMBEDDED_HTTP_PORT\\) is taken"):
            EmbeddedTriton(settings=Settings(model_dir=prepared_models, embedded_http_port=taken))


@pytest.mark.triton
def test_two_embedded_instances_side_by_side_each_use_their_own_triton(prepared_models):
    from keyrank.reranker import Reranker

    settings = Settings(model_dir=prepared_models)  # the defaults: no ports given
    with Reranker.embedded(settings) as first, Reranker.embedded(settings) as second:
        a, b = first._embedded, second._embedded
        assert {a.http_port, a.grpc_port, a.metrics_port}.isdisjoint({b.http_port, b.grpc_port, b.metrics_port})
        assert a.pid != b.pid and a.server_id != b.server_id
        assert (a.admin.server_id(), b.admin.server_id()) == (a.server_id, b.server_id)
        assert first.rank(BODY["query"], BODY["documents"]).results[0].index == 0
        assert second.rank(BODY["query"], BODY["documents"]).results[0].index == 0
        # The first one's death leaves the second one serving (no shared server behind either).
        a.stop()
        assert b.admin.server_id() == b.server_id
        assert second.rank(BODY["query"], BODY["documents"]).results[0].index == 0


@pytest.mark.triton
def test_the_ready_probe_never_takes_another_server_on_our_port_for_ours(prepared_models, embedded_triton, monkeypatch):
    # The race the port check cannot close: our port is taken after we checked it. The other
    # server answers every health probe; only its id tells it apart, and our own server dies.
    from keyrank.modelserver import embedded as triton_server

    monkeypatch.setattr(triton_server, "check_port_free", lambda port, setting: None)
    settings = Settings(model_dir=prepared_models, embedded_http_port=embedded_triton.http_port)
    server = EmbeddedTriton(settings=settings, supervise=False)
    assert server.admin.server_ready()  # the other server says "ready" on our address
    try:
        server.start()
        with pytest.raises(EmbeddedTritonError) as failure:
            server.wait_ready(60)
    finally:
        server.close()
    assert f"port {embedded_triton.http_port} (KEYRANK_EMBEDDED_HTTP_PORT) is already in use" in str(failure.value)
    assert not server.serving
    assert embedded_triton.admin.server_id() == embedded_triton.server_id


@pytest.mark.triton
@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v2/models/{model}/config"),
    ("POST", "/v2/repository/index"),
    ("POST", "/v2/repository/models/{model}/unload"),
    ("GET", "/v2/models/{model}/stats"),
    ("GET", "/v2/logging"),
    ("GET", "/v2/trace/setting"),
    ("GET", "/v2/systemsharedmemory/status"),
])
def test_admin_apis_need_the_instance_key(embedded_triton, method, path):
    url = embedded_triton.http_url + path.format(model=embedded_triton.model)
    body = {} if method == "POST" else None
    refused = httpx.request(method, url, json=body)
    assert refused.status_code == 403, refused.text
    if "unload" not in path:  # with the key it answers (an unload is tested by the supervision tests)
        assert httpx.request(method, url, json=body, headers={ADMIN_HEADER: embedded_triton.admin_key}).status_code == 200


@pytest.mark.triton
def test_health_metadata_and_inference_need_no_key_over_http_and_grpc(embedded_triton):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    base, model = embedded_triton.http_url, embedded_triton.model
    for path in ("/v2/health/live", "/v2/health/ready", "/v2", f"/v2/models/{model}", f"/v2/models/{model}/ready"):
        assert httpx.get(base + path).status_code == 200, path
    assert embedded_triton.admin.probe_inference(model, timeout=10) is None

    client = grpcclient.InferenceServerClient(embedded_triton.grpc_url)
    try:
        assert client.is_server_ready() and client.is_model_ready(model)
        assert client.get_model_metadata(model).name == model
        inputs = []
        for name in ("input_ids", "attention_mask", "token_type_ids"):
            tensor = grpcclient.InferInput(name, [1, 8], "INT64")
            tensor.set_data_from_numpy(np.ones((1, 8), dtype=np.int64))
            inputs.append(tensor)
        assert client.infer(model, inputs).as_numpy("logits").shape == (1, 1)
        with pytest.raises(InferenceServerException, match="restricted"):
            client.get_model_config(model)
        with pytest.raises(InferenceServerException, match="restricted"):
            client.unload_model(model)
        assert client.get_model_config(model, headers={GRPC_ADMIN_HEADER: embedded_triton.admin_key}).config.name == model
    finally:
        client.close()


def test_the_admin_key_differs_per_instance_and_never_appears_in_its_addresses(prepared_models):
    a = EmbeddedTriton(settings=Settings(model_dir=Path(prepared_models)), supervise=False)
    b = EmbeddedTriton(settings=Settings(model_dir=Path(prepared_models)), supervise=False)
    try:
        assert a.admin_key != b.admin_key and len(a.admin_key) >= 32
        assert a.admin_key not in a.grpc_url + a.http_url
    finally:
        a.close()
        b.close()


@pytest.mark.triton
def test_serves_as_tells_our_triton_from_another_over_grpc(embedded_triton):
    import asyncio

    import tritonclient.grpc.aio as grpc_aio
    from keyrank.scoring.triton import serves_as

    async def ask(expected: str | None) -> bool:
        client = grpc_aio.InferenceServerClient(embedded_triton.grpc_url)
        try:
            return await serves_as(client, expected, timeout=5)
        finally:
            await client.close()

    assert asyncio.run(ask(embedded_triton.server_id))
    assert not asyncio.run(ask("keyrank-someone-else"))
    assert asyncio.run(ask(None))  # an external Triton: no id expected
