"""An installed interaction graph on the model server is part of what is served: its Triton model is written well-formed
for the production repository, watched and repaired by the supervisor like the cross-encoder (readiness turns 503 while
it cannot score) and covered by the guard sidecar's liveness, and with several models on one repository (KEYRANK_MODELS,
the chart's models.served) each model's graph is staged under a name of its own and found by that model's scorer."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from interaction_graphs import install
from keyrank.config import Settings
from toy_judged import tiny_bert

QUERY = "how do cats purr"
DOCS = [
    " ".join(["The quick brown fox jumps over the lazy dog."] * 30 + ["Cats purr by vibrating the muscles of the larynx."] * 25),
    "a cat is an animal",
    " ".join(["Search engines rank documents by relevance."] * 70),
]
KIND = "model1"
GRAPH = f"{KIND}-features"


@pytest.fixture(scope="module")
def graph_models(tmp_path_factory) -> dict[str, Path]:
    """Two prepared tiny BERTs with Neural Model 1 installed, Triton models included: "a", and "b" whose translation
    network T(q|d) (inside the graph) and head have other weights, so the two models' graphs of one kind score apart."""
    from keyrank.prepare.export import prepare

    root = tmp_path_factory.mktemp("graph-serving")
    checkpoint = tiny_bert(root / "tiny-bert")
    a, b = root / "models-a", root / "models-b"
    prepare(str(checkpoint), a, bi_encoder=None)
    shutil.copytree(a, b)
    install(checkpoint, a, KIND, seed=0, triton=True)
    install(checkpoint, b, KIND, seed=1, triton=True)
    return {"a": a, "b": b}


def _local_scores(models: Path) -> list[float]:
    from keyrank.reranker import Reranker

    with Reranker.local(models) as reranker:
        ranking = reranker.rank(QUERY, DOCS, strategy=KIND)
    return [score for _, score in sorted((r.index, r.score) for r in ranking.results)]


def _http_scores(url: str, **fields: str) -> list[float]:
    answer = httpx.post(f"{url}/rerank", json={"query": QUERY, "documents": DOCS, "strategy": KIND, **fields}, timeout=120)
    assert answer.status_code == 200, answer.text
    return [score for _, score in sorted((r["index"], r["relevance_score"]) for r in answer.json()["results"])]


# --- the production repository's config ---------------------------------------------------------------


def test_the_production_config_of_a_graph_is_well_formed_and_names_the_graphs_inputs_and_outputs(graph_models):
    """triton/<kind>-features/config.pbtxt, read with Triton's own schema (ModelConfig, protobuf text format), declares
    the ONNX graph's inputs and outputs by name, type and shape (the feature width as the graph answers it), for the
    native onnxruntime backend, and warms up with every input."""
    import onnxruntime as ort
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    def read(repository: str):
        text = (graph_models["a"] / repository / GRAPH / "config.pbtxt").read_text()
        return text_format.Parse(text, model_config_pb2.ModelConfig())  # raises on anything Triton could not read

    config = read("triton")
    assert config.name == GRAPH and config.backend == "onnxruntime" and config.max_batch_size > 0
    session = ort.InferenceSession(str(graph_models["a"] / "triton" / GRAPH / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        (i.name, model_config_pb2.TYPE_INT64, [-1]) for i in session.get_inputs()]  # [N, L]: N is Triton's batch axis
    assert [i.type for i in session.get_inputs()] == ["tensor(int64)"] * 4
    roles = np.array([[0, 1, 1, 0, 2, 2, 2, 0]] * 2, dtype=np.int64)
    answers = session.run(None, {"input_ids": np.ones_like(roles), "attention_mask": np.ones_like(roles),
                                 "token_type_ids": (roles == 2).astype(np.int64), "token_roles": roles})
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        (o.name, model_config_pb2.TYPE_FP32, list(answer.shape[1:])) for o, answer in zip(session.get_outputs(), answers)]
    assert [answer.dtype for answer in answers] == [np.float32, np.float32]
    assert config.model_warmup and all(set(w.inputs) == {i.name for i in config.input} for w in config.model_warmup)
    embedded = read("triton-embedded")  # the embedded server's model over the same graph: the same tensors
    assert embedded.backend == "python" and embedded.input == config.input and embedded.output == config.output


# --- supervision: the graph is watched and repaired like the cross-encoder --------------------------------


@pytest.mark.triton
def test_a_killed_graph_model_process_turns_readyz_503_within_a_second_and_is_repaired_once_alone(graph_models, tmp_path):
    from keyrank.modelserver.stubs import model_stubs
    from process_tree import start_serve, stop, tritonserver_of, wait_status

    def live_stubs(triton: int, model: str = GRAPH) -> set[int]:
        return {pid for pid, stub in model_stubs(triton, model).items() if stub.state not in ("Z", "X")}

    log = tmp_path / "serve.log"
    proc, url = start_serve(graph_models["a"], log)
    try:
        wait_status(url, "/readyz", 200, timeout=180)
        before = _http_scores(url)
        triton = tritonserver_of(proc.pid)
        (stub,) = live_stubs(triton)
        cross_encoder = live_stubs(triton, "cross_encoder")
        os.kill(stub, signal.SIGKILL)  # what the OOM killer does to a model process
        killed = time.monotonic()
        wait_status(url, "/readyz", 503, timeout=1.0)  # the strategy is not served: readiness says so
        wait_status(url, "/readyz", 200, timeout=10.0)
        assert time.monotonic() - killed < 10.0
        np.testing.assert_allclose(_http_scores(url), before, rtol=1e-5, atol=1e-5)
        assert tritonserver_of(proc.pid) == triton  # a model reload, not a server restart
        assert len(live_stubs(triton)) == 1 and stub not in live_stubs(triton)
        assert live_stubs(triton, "cross_encoder") == cross_encoder  # only the faulty graph was reloaded
        time.sleep(2.0)  # the replaced stub's exit, seconds later, must not read as another crash
        assert log.read_text().count("repairing") == 1, log.read_text()[-3000:]
    finally:
        stop(proc)


@pytest.mark.triton
def test_readyz_is_503_while_the_graph_model_is_not_loaded_and_the_supervisor_loads_it_again(graph_models):
    from keyrank.api import create_app
    from keyrank.modelserver.embedded import EmbeddedTriton
    from keyrank.modelserver.supervision import Supervisor
    from live_gateway import serving
    from process_tree import wait_status

    settings = Settings(model_dir=graph_models["a"])
    with EmbeddedTriton(settings=settings, supervise=False) as triton:
        assert triton.graphs == (GRAPH,)
        assert triton.admin.probe_inference(GRAPH, timeout=30, graph=True) is None  # the probe the supervisor sends
        gateway = settings.with_overrides(triton_url=triton.grpc_url, triton_server_id=triton.server_id)
        with serving(create_app(gateway), ready_path="/readyz") as url:
            assert triton.admin.unload(GRAPH)  # behind the gateway's back; the cross-encoder stays loaded
            wait_status(url, "/readyz", 503, timeout=5.0)
            assert triton.admin.model_ready(triton.model)
            triton.supervisor = supervisor = Supervisor(triton, tick_s=0.05, http_every_s=0.1)  # stopped with the server
            supervisor.start()
            wait_status(url, "/readyz", 200, timeout=30.0)
            assert [how for how, _ in supervisor.repairs] == ["model reload"]
            np.testing.assert_allclose(_http_scores(url), _local_scores(graph_models["a"]), rtol=1e-4, atol=1e-4)


# --- several models on one repository -------------------------------------------------------------------------


@pytest.mark.triton
def test_several_models_each_serve_their_own_graph_of_one_kind_from_one_repository(graph_models):
    """KEYRANK_MODELS with two folders that both installed Model 1: each graph staged under its model's name, loaded,
    and each model's requests scored by its own graph (as that folder alone scores in-process)."""
    from keyrank.api import create_app
    from keyrank.modelserver.embedded import EmbeddedTriton
    from live_gateway import serving

    settings = Settings(models=",".join(f"{name}={folder}" for name, folder in graph_models.items()))
    with EmbeddedTriton(settings=settings) as triton:
        assert triton.graphs == (f"a:{GRAPH}", f"b:{GRAPH}")
        gateway = settings.with_overrides(triton_url=triton.grpc_url, triton_server_id=triton.server_id)
        with serving(create_app(gateway), ready_path="/readyz") as url:
            served = {name: _http_scores(url, model=name) for name in graph_models}
    local = {name: _local_scores(folder) for name, folder in graph_models.items()}
    for name in graph_models:
        np.testing.assert_allclose(served[name], local[name], rtol=1e-4, atol=1e-4)
    assert not np.allclose(local["a"], local["b"], atol=1e-3)  # two graphs of one kind: the test tells them apart


@pytest.mark.triton
def test_the_charts_repository_script_stages_each_models_graphs_under_the_names_its_gateway_asks_for(graph_models, tmp_path):
    """The Helm chart's served repository (models.served) holds each model's graphs as KEYRANK_MODELS stages them,
    so the gateway of each model finds its own graph on the production Triton too."""
    from chart_repository import build_served_repository
    from keyrank.modelserver.embedded import EmbeddedTriton
    from keyrank.reranker import Reranker

    repository = build_served_repository(graph_models, tmp_path)
    assert sorted(p.name for p in repository.iterdir()) == ["a", f"a:{GRAPH}", "b", f"b:{GRAPH}"]
    settings = Settings(models=",".join(f"{name}={folder}" for name, folder in graph_models.items()))
    with EmbeddedTriton(repository, settings=Settings(triton_model="a"), supervise=False) as triton:
        assert triton.graphs == (f"a:{GRAPH}", f"b:{GRAPH}")
        for name, folder in graph_models.items():
            gateway = settings.for_model(name, folder).with_overrides(triton_url=triton.grpc_url, request_timeout_s=120)
            with Reranker(gateway) as reranker:
                ranking = reranker.rank(QUERY, DOCS, strategy=KIND)
            served = [score for _, score in sorted((r.index, r.score) for r in ranking.results)]
            np.testing.assert_allclose(served, _local_scores(folder), rtol=1e-4, atol=1e-4)


@pytest.mark.triton
def test_the_guard_fails_liveness_when_a_graph_model_process_dies(graph_models):
    """Kubernetes: the guard sidecar's liveness covers the interaction graphs it finds in Triton's repository, so the
    kubelet restarts a Triton whose graph cannot score, as it does one whose cross-encoder cannot."""
    from keyrank.modelserver.admin import TritonAdmin
    from keyrank.modelserver.embedded import ADMIN_HEADER, EmbeddedTriton
    from keyrank.modelserver.guard import ModelPathCheck
    from keyrank.modelserver.stubs import model_stubs
    from process_tree import guard_serving, wait_status

    with EmbeddedTriton(settings=Settings(model_dir=graph_models["a"]), supervise=False) as triton:
        # The embedded server keeps its repository index behind its admin key; the production one has none.
        check = ModelPathCheck(TritonAdmin(triton.http_url, (ADMIN_HEADER, triton.admin_key)), triton.model, every_s=0.1,
                               probe_every_s=0.5, probe_timeout_s=10.0, hang_after_s=30.0)
        with guard_serving(check) as guard:
            wait_status(guard, "/v2/health/live", 200, timeout=30)
            assert check.watched() == [triton.model, GRAPH]
            (stub,) = model_stubs(triton.pid, GRAPH)
            os.kill(stub, signal.SIGKILL)
            wait_status(guard, "/v2/health/live", 503, timeout=5)
            assert httpx.get(f"{triton.http_url}/v2/health/live").status_code == 200  # Triton's own probe is blind
            assert GRAPH in httpx.get(f"{guard}/v2/health/live").json()["error"]
            assert triton.admin.probe_inference(triton.model, 10) is None  # the cross-encoder itself still scores
