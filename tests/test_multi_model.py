"""Several models, one deployment (docs/API.md): the real cross-encoder ("base") and a tiny BERT fine-tuned
by `keyrank finetune` on the toy judged set ("tiny") served side by side; the request's ``model`` picks one on every route, absent = the default, an unknown
name is a 422 listing both, discovery lists both, metrics carry the model.

Each model's answers must be what that model alone gives (``Reranker.local`` of its folder): a gateway that
mixed models (one scorer, one document cache) would answer one model's scores for the other."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from keyrank.api import create_app
from keyrank.config import Settings
from keyrank.reranker import Reranker
from live_gateway import metric_samples, serving
from toy_judged import tiny_bert, toy_trec

DEFAULT_STRATEGY = Settings.model_fields["default_strategy"].default
"""What a request that names no strategy is ranked with (keyb2-blocks)."""

QUERY = "when was the budget agreed"
DOCS = [
    "The budget was agreed on Tuesday by the finance committee after a long meeting.",
    "Cats sleep most of the day and hunt at night.",
    "The remote control design meeting discussed buttons and the budget. " * 30,
]
RERANK_ROUTES = ("/rerank", "/v1/rerank", "/v2/rerank", "/tei/rerank", "/infinity/rerank")


@pytest.fixture(scope="module")
def folders(prepared_models: Path, tmp_path_factory) -> dict[str, Path]:
    """The base model (the session's prepared models/) and a tiny BERT fine-tuned for one epoch on the toy
    judged set (tests/toy_judged.py, as test_finetune.py does) and prepared beside it (~40 s)."""
    import torch
    from keyrank.prepare.export import prepare
    from keyrank.training import finetune
    from keyrank.training.recipe import TrecFiles

    root = tmp_path_factory.mktemp("multi-model")
    torch.set_num_threads(2)
    trained = finetune(
        model=str(tiny_bert(root / "tiny-bert")), out=root / "run", strategy="keyb2", selector="bm25",
        trec=TrecFiles(*toy_trec(root)), epochs=1, lr=5e-3, groups_per_step=2, sequences_per_forward=8, seed=0,
        progress=False, threads=2, dev_max_queries=None,
    )
    out = root / "models-tiny"
    prepare(str(trained.model_dir), out, bi_encoder=None)
    return {"base": Path(prepared_models), "tiny": out}


@pytest.fixture(scope="module")
def alone(folders) -> Iterator[dict[str, Reranker]]:
    """Each model alone, in-process: the reference scores."""
    rerankers = {name: Reranker.local(folder) for name, folder in folders.items()}
    yield rerankers
    for reranker in rerankers.values():
        reranker.close()


def models_setting(folders: dict[str, Path]) -> str:
    return ",".join(f"{name}={folder}" for name, folder in folders.items())


@pytest.fixture(scope="module")
def local_gateway(folders) -> Iterator[str]:
    """A gateway serving both models, each scored in-process (ONNX Runtime): the routing alone."""
    settings = Settings(models=models_setting(folders))
    rerankers = {name: Reranker.local(folder, model_name=name) for name, folder in folders.items()}
    try:
        with serving(create_app(settings, rerankers=rerankers), ready_path="/readyz") as url:
            yield url
    finally:
        for reranker in rerankers.values():
            reranker.close()


def _scores(body: dict) -> list[tuple[int, float]]:
    return [(r["index"], r["relevance_score"]) for r in body["results"]]


def _expected(reranker: Reranker) -> list[tuple[int, float]]:
    return [(r.index, r.score) for r in reranker.rank(QUERY, DOCS).results]


def _assert_same(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    assert [i for i, _ in got] == [i for i, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-4)


# --- settings ------------------------------------------------------------------------------------


def test_models_setting_is_parsed_with_the_default_first():
    settings = Settings(models="base=models, ft=/srv/models-ft", default_model="ft")
    assert settings.served_models() == {"ft": Path("/srv/models-ft"), "base": Path("models")}
    assert list(Settings(models="a=x,b=y").served_models()) == ["a", "b"]
    assert Settings().served_models() == {}
    one = Settings(models="a=x,b=y").for_model("b", Path("y"))
    assert (one.model_dir, one.triton_model, one.model_name) == (Path("y"), "b", "b")


@pytest.mark.parametrize(
    ("models", "default", "named"),
    [
        ("base", None, "'base' is not name=folder"),
        ("base=", None, "'base=' is not name=folder"),
        ("bad name=models", None, "'bad name=models' is not name=folder"),
        ("a=x,a=y", None, "the name 'a' is given twice"),
        ("a=x,b=y", "c", "default_model (KEYRANK_DEFAULT_MODEL) 'c' is not one of models: a, b"),
        (None, "a", "default_model (KEYRANK_DEFAULT_MODEL) is set but models (KEYRANK_MODELS) is not"),
    ],
)
def test_a_malformed_models_setting_is_refused_naming_it(models, default, named):
    settings = Settings(models=models, default_model=default)
    with pytest.raises(ValueError, match="KEYRANK_") as caught:
        settings.served_models()
    assert named in str(caught.value)
    with pytest.raises(ValueError, match="KEYRANK_"):
        create_app(settings)  # before anything is served


# --- routing (each model scored in-process) -----------------------------------------------------------


@pytest.mark.parametrize("name", ["base", "tiny"])
def test_the_model_field_picks_the_model_and_gives_its_own_scores(local_gateway, alone, name):
    answer = httpx.post(f"{local_gateway}/rerank", json={"query": QUERY, "documents": DOCS, "model": name}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == name
    _assert_same(_scores(answer.json()), _expected(alone[name]))


def test_the_two_models_rank_differently_and_absent_means_the_default(local_gateway, alone):
    base, tiny = _expected(alone["base"]), _expected(alone["tiny"])
    assert [s for _, s in base] != pytest.approx([s for _, s in tiny], abs=1e-3)  # else the test could not tell them apart
    answer = httpx.post(f"{local_gateway}/rerank", json={"query": QUERY, "documents": DOCS}, timeout=60).json()
    assert answer["model"] == "base"
    _assert_same(_scores(answer), base)


def test_the_same_documents_alternating_between_models_never_mix(local_gateway, alone):
    """The document cache is per model: documents seen by one model are tokenized anew by the other."""
    for name in ("tiny", "base", "tiny", "base"):
        answer = httpx.post(f"{local_gateway}/rerank", json={"query": QUERY, "documents": DOCS, "model": name}, timeout=60)
        _assert_same(_scores(answer.json()), _expected(alone[name]))


@pytest.mark.parametrize(
    ("route", "body", "score_key"),
    [
        ("/v1/rerank", {"query": QUERY, "documents": DOCS}, "relevance_score"),
        ("/v2/rerank", {"query": QUERY, "documents": DOCS}, "relevance_score"),
        ("/infinity/rerank", {"query": QUERY, "documents": DOCS, "raw_scores": True}, "relevance_score"),
        ("/tei/rerank", {"query": QUERY, "texts": DOCS, "raw_scores": True}, "score"),
    ],
)
def test_every_vendor_route_reads_its_model_field(local_gateway, alone, route, body, score_key):
    from keyrank.api.routes import sigmoid

    for name in ("tiny", "base"):
        answer = httpx.post(f"{local_gateway}{route}", json={**body, "model": name}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert "X-Keyrank-Ignored-Fields" not in answer.headers  # the model was used, not ignored
        results = answer.json() if route == "/tei/rerank" else answer.json()["results"]
        got = [(r["index"], r[score_key]) for r in results]
        raw = body.get("raw_scores", False)
        _assert_same(got, [(i, s if raw else sigmoid(s)) for i, s in _expected(alone[name])])


@pytest.mark.parametrize("route", RERANK_ROUTES)
def test_an_unknown_model_is_a_422_naming_the_field_and_listing_the_served_models(local_gateway, route):
    documents = "texts" if route == "/tei/rerank" else "documents"
    answer = httpx.post(f"{local_gateway}{route}", json={"query": QUERY, documents: DOCS, "model": "rerank-v3.5"}, timeout=60)
    assert answer.status_code == 422, answer.text
    text = answer.text
    assert "model" in text and "'rerank-v3.5'" in text and "base, tiny" in text


def test_infinity_placeholder_means_the_default(local_gateway, alone):
    answer = httpx.post(f"{local_gateway}/infinity/rerank", timeout=60,
                        json={"model": "default/not-specified", "query": QUERY, "documents": DOCS, "raw_scores": True})
    assert answer.status_code == 200 and answer.json()["model"] == "base"
    _assert_same([(r["index"], r["relevance_score"]) for r in answer.json()["results"]], _expected(alone["base"]))


def test_discovery_lists_every_served_model_default_first(local_gateway):
    assert [m["id"] for m in httpx.get(f"{local_gateway}/v1/models").json()["data"]] == ["base", "tiny"]
    assert [m["id"] for m in httpx.get(f"{local_gateway}/infinity/models").json()["data"]] == ["base", "tiny"]
    info = httpx.get(f"{local_gateway}/tei/info").json()
    assert (info["model_id"], info["models"]) == ("base", ["base", "tiny"])
    assert all(m["created"] > 0 for m in httpx.get(f"{local_gateway}/v1/models").json()["data"])


def test_requests_are_counted_with_their_model(local_gateway):
    before = metric_samples(local_gateway)
    httpx.post(f"{local_gateway}/rerank", json={"query": QUERY, "documents": DOCS, "model": "tiny"}, timeout=60)
    httpx.post(f"{local_gateway}/v2/rerank", json={"query": QUERY, "documents": DOCS, "model": "nope"}, timeout=60)
    after = metric_samples(local_gateway)

    def delta(**labels: str) -> float:
        key = ("keyrank_requests_total", tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta(endpoint="/rerank", strategy=DEFAULT_STRATEGY, outcome="ok", model="tiny") == 1
    assert delta(endpoint="/rerank", strategy=DEFAULT_STRATEGY, outcome="ok", model="base") == 0
    assert delta(endpoint="/v2/rerank", strategy=DEFAULT_STRATEGY, outcome="invalid", model="-") == 1  # no served model named


# --- keyrank serve: one embedded Triton loads every model --------------------------------------------


@pytest.mark.triton
def test_keyrank_serve_loads_every_model_in_one_embedded_triton_and_watches_each(folders, alone, tmp_path):
    import os
    import signal

    from keyrank.modelserver.stubs import model_stubs
    from process_tree import start_serve, stop, tritonserver_of, wait_status

    log = tmp_path / "serve.log"
    proc, url = start_serve(folders["base"], log, KEYRANK_MODELS=models_setting(folders), KEYRANK_DEFAULT_MODEL="tiny")
    try:
        wait_status(url, "/readyz", 200, timeout=180)
        triton = tritonserver_of(proc.pid)
        for name in ("base", "tiny"):  # the same request, each model's own scores, on the real Triton
            answer = httpx.post(f"{url}/rerank", json={"query": QUERY, "documents": DOCS, "model": name}, timeout=120)
            assert answer.status_code == 200 and answer.json()["model"] == name, answer.text
            _assert_same(_scores(answer.json()), _expected(alone[name]))
        default = httpx.post(f"{url}/rerank", json={"query": QUERY, "documents": DOCS}, timeout=120).json()
        assert default["model"] == "tiny"  # KEYRANK_DEFAULT_MODEL
        unknown = httpx.post(f"{url}/v1/rerank", json={"query": QUERY, "documents": DOCS, "model": "ft"}, timeout=60)
        assert unknown.status_code == 422 and "served models: tiny, base" in unknown.json()["detail"]
        assert [m["id"] for m in httpx.get(f"{url}/v1/models").json()["data"]] == ["tiny", "base"]

        # Supervision watches each model: the second model's process killed -> /readyz 503, then repaired.
        (stub,) = model_stubs(triton, "base")
        os.kill(stub, signal.SIGKILL)
        wait_status(url, "/readyz", 503, timeout=5)
        wait_status(url, "/readyz", 200, timeout=60)
        answer = httpx.post(f"{url}/rerank", json={"query": QUERY, "documents": DOCS, "model": "base"}, timeout=120)
        _assert_same(_scores(answer.json()), _expected(alone["base"]))
        assert tritonserver_of(proc.pid) == triton  # a model reload, not a restart
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()[-3000:]
        assert "serving tiny, base" in log.read_text()
    finally:
        stop(proc)


@pytest.mark.parametrize("how", ["environment", "--models"])
def test_keyrank_serve_names_a_malformed_models_setting_before_starting(folders, tmp_path, how):
    import os
    import subprocess
    import sys

    env = {**os.environ, "KEYRANK_MODEL_DIR": str(folders["base"])}
    args = [sys.executable, "-m", "keyrank.cli", "serve"]
    if how == "--models":
        args += ["--models", "base"]
    else:
        env["KEYRANK_MODELS"] = "base"
    out = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2
    assert "models (KEYRANK_MODELS): 'base' is not name=folder" in out.stderr and "Traceback" not in out.stderr


def test_keyrank_serve_names_a_model_folder_that_was_not_prepared(folders, tmp_path):
    from process_tree import start_serve

    ghost = tmp_path / "ghost"
    proc, _ = start_serve(folders["base"], tmp_path / "serve.log", KEYRANK_MODELS=f"base={folders['base']},ghost={ghost}")
    assert proc.wait(60) == 1
    said = (tmp_path / "serve.log").read_text()
    assert f"model 'ghost': {ghost}/triton-embedded/cross_encoder/config.pbtxt not found" in said and "Traceback" not in said


def test_the_openapi_schema_lists_the_served_names_for_every_model_field(local_gateway):
    schemas = httpx.get(f"{local_gateway}/openapi.json").json()["components"]["schemas"]
    for name in ("RerankRequest", "V1RerankRequest", "CohereRerankRequest", "TeiRerankRequest"):
        field = schemas[name]["properties"]["model"]
        assert [b["enum"] for b in field.get("anyOf", [field]) if b.get("type") == "string"] == [["base", "tiny"]], name
    assert schemas["InfinityRerankRequest"]["properties"]["model"]["enum"] == ["base", "tiny", "default/not-specified"]


def test_with_one_model_another_name_still_ranks_and_is_named_as_ignored(folders, alone):
    """Single-model deployments keep the vendor routes' behaviour, on POST /rerank too."""
    reranker = Reranker.local(folders["base"])
    try:
        with serving(create_app(Settings(), reranker=reranker), ready_path="/readyz") as url:
            served = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
            for route, documents in (("/rerank", "documents"), ("/v1/rerank", "documents"), ("/tei/rerank", "texts")):
                other = httpx.post(f"{url}{route}", json={"query": QUERY, documents: DOCS, "model": "tiny"}, timeout=60)
                assert other.status_code == 200 and other.headers["X-Keyrank-Ignored-Fields"] == "model", (route, other.text)
                same = httpx.post(f"{url}{route}", json={"query": QUERY, documents: DOCS, "model": served}, timeout=60)
                assert same.status_code == 200 and "X-Keyrank-Ignored-Fields" not in same.headers, route
            native = httpx.post(f"{url}/rerank", json={"query": QUERY, "documents": DOCS, "model": "tiny"}, timeout=60).json()
            assert native["model"] == served
            _assert_same(_scores(native), _expected(alone["base"]))  # the one model ranked
            assert "enum" not in str(httpx.get(f"{url}/openapi.json").json()["components"]["schemas"]["RerankRequest"]["properties"]["model"])
    finally:
        reranker.close()


def test_the_playground_offers_every_served_model(local_gateway):
    page = httpx.get(f"{local_gateway}/playground").text
    assert '"models": ["base", "tiny"]' in page  # its model choice; the page sends `model` when there are several


@pytest.mark.triton
def test_serve_models_option_reaches_every_uvicorn_worker(folders, alone, tmp_path):
    """--models on the command line (not the environment) with two uvicorn workers: workers read their settings
    from the environment, so without `serve` passing the list on they would serve one model and answer its name."""
    import os
    import signal
    import subprocess
    import sys

    from process_tree import free_port, stop, wait_status

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEYRANK_")}
    log = tmp_path / "serve.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "keyrank.cli", "serve", "--models", models_setting(folders), "--default-model", "tiny",
             "--workers", "2", "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_status(url, "/readyz", 200, timeout=180)
        for _ in range(4):  # new connections: both workers answer sooner or later
            for name in ("base", "tiny"):
                answer = httpx.post(f"{url}/rerank", json={"query": QUERY, "documents": DOCS, "model": name}, timeout=120)
                assert answer.status_code == 200 and answer.json()["model"] == name, answer.text
                _assert_same(_scores(answer.json()), _expected(alone[name]))
        assert httpx.post(f"{url}/rerank", json={"query": QUERY, "documents": DOCS}, timeout=120).json()["model"] == "tiny"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
    finally:
        stop(proc)


@pytest.mark.triton
def test_the_charts_repository_script_builds_a_repository_tritonserver_loads(folders, tmp_path):
    """The Helm chart's model-repository init container (models.served), run here on the prepared folders: each
    model under its name, config renamed, version folder linked. The embedded CPU repository stands in for the
    GPU one (same layout) so the real tritonserver of this machine can load it."""
    from chart_repository import build_served_repository
    from keyrank.modelserver.embedded import EmbeddedTriton

    repository = build_served_repository(folders, tmp_path)
    for name in folders:
        with EmbeddedTriton(repository, settings=Settings(triton_model=name), supervise=False) as server:
            assert server.admin.model_ready(name) and server.admin.probe_inference(name, 60) is None


@pytest.mark.triton
def test_a_repository_folder_given_by_hand_keeps_every_model_loadable(prepared_models, tmp_path):
    """EmbeddedTriton(repository) serves a staged copy: its other models are staged too, loaded on demand through
    the admin API (explicit model control loads only the default one at start), as from the folder itself."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    from keyrank.modelserver.embedded import GRPC_ADMIN_HEADER, EmbeddedTriton

    source = Path(prepared_models) / "triton-embedded" / "cross_encoder"
    repo = tmp_path / "repo"
    for name in ("cross_encoder", "second"):
        (repo / name / "1").mkdir(parents=True)
        config = (source / "config.pbtxt").read_text().replace('name: "cross_encoder"', f'name: "{name}"')
        (repo / name / "config.pbtxt").write_text(config)
        for file in (source / "1").iterdir():
            if file.name != "__pycache__":
                (repo / name / "1" / file.name).symlink_to(file.resolve())
    settings = Settings(embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0)
    with EmbeddedTriton(repo, settings=settings) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert not client.is_model_ready("second")
        client.load_model("second", headers={GRPC_ADMIN_HEADER: server.admin_key})
        inputs = []
        for name in ("input_ids", "attention_mask", "token_type_ids"):
            tensor = grpcclient.InferInput(name, [1, 8], "INT64")
            tensor.set_data_from_numpy(np.ones((1, 8), np.int64))
            inputs.append(tensor)
        logits = client.infer("second", inputs).as_numpy("logits")
        assert logits.shape == (1, 1) and np.isfinite(logits).all()
