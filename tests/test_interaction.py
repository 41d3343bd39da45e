"""CEDR-KNRM and Neural Model 1: a document scored in chunks (the interaction graph per chunk, the gateway's fold
and head) equals a plain PyTorch implementation reading the concatenation of the same chunks' similarity
matrices whole; a strategy whose trained parts are missing is refused naming the command that trains them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from keyrank.errors import InvalidRequest
from keyrank.interaction import HISTOGRAM_BINS, KERNEL_MUS, KERNEL_SIGMAS, features_file, head_file
from interaction_graphs import install
from toy_judged import tiny_bert

QUERY = "how do cats purr"
DOCS = [
    " ".join(["The quick brown fox jumps over the lazy dog."] * 30 + ["Cats purr by vibrating the muscles of the larynx."] * 25),
    "a cat is an animal",
    " ".join(["Search engines rank documents by relevance."] * 70),
]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A tiny BERT prepared as `keyrank prepare` writes it, and its checkpoint."""
    from keyrank.prepare.export import prepare

    root = tmp_path_factory.mktemp("interaction")
    checkpoint = tiny_bert(root / "tiny-bert")
    prepare(str(checkpoint), root / "models", bi_encoder=None)
    return checkpoint, root / "models"


def _install(prepared, kind: str) -> torch.nn.Module:
    """The kind's graph (encoder + chunk features) and a head with weights away from their start, installed."""
    checkpoint, models = prepared
    return install(checkpoint, models, kind)


def _chunks(reranker, strategy: str):
    """Each document's chunks as the served strategy cuts them: (ids, query length, document token range)."""
    from keyrank.pipeline import RerankOptions

    plan = reranker.pipeline.plan(QUERY, DOCS, RerankOptions(strategy="avgp"))
    q = len(plan.query)
    chunks = [[] for _ in DOCS]
    for ids, doc in zip(plan.inputs.ids, plan.doc_of):
        # [CLS] q [SEP] d [SEP]: the reference finds the tokens by BERT's frame, not by the gateway's roles
        chunks[doc].append((torch.from_numpy(ids)[None], q, (q + 2, len(ids) - 1)))
    assert max(len(c) for c in chunks) >= 3  # the test reads long documents in several chunks
    return chunks


def _hidden(model, ids, q):
    types = torch.zeros_like(ids)
    types[:, q + 2:] = 1
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=types, output_hidden_states=True)
    return out.hidden_states, out.pooled_cls


def _whole_matrices(model, chunks, dtype=torch.float64):
    """Each chunk's [layers, Q, chunk tokens] similarity matrices concatenated along the document, and the chunks'
    [CLS] pooled vectors."""
    matrices, pooled = [], []
    for ids, q, (start, end) in chunks:
        states, cls = _hidden(model, ids, q)
        per_layer = []
        for h in states:
            h = torch.nn.functional.normalize(h[0].to(dtype), dim=-1)
            per_layer.append(h[1:1 + q] @ h[start:end].T)
        matrices.append(torch.stack(per_layer))
        pooled.append(cls[0].double())
    return torch.cat(matrices, dim=2), torch.stack(pooled)


def _reference_knrm(model, chunks, weight_kernels, weight_head, bias):
    """CEDR-KNRM as the paper computes it: similarity matrices of each chunk, concatenated along the document, then
    the RBF kernels over the whole matrix, log, x 0.01, summed over query tokens; linear with the mean [CLS]."""
    mus, sigmas = torch.tensor(KERNEL_MUS, dtype=torch.float64), torch.tensor(KERNEL_SIGMAS, dtype=torch.float64)
    whole, pooled = _whole_matrices(model, chunks)
    kernels = torch.exp(-((whole.unsqueeze(-1) - mus) ** 2) / (2 * sigmas**2)).sum(2)  # [layers, Q, K]
    features = (torch.log(kernels.clamp(min=1e-10)) * 0.01).sum(1).reshape(-1)  # [layers * K]
    return float(features @ weight_kernels.double() + pooled.mean(0) @ weight_head.double() + bias)


def _reference_drmm(model, chunks, head):
    """CEDR-DRMM: the hard histogram of the whole matrix per query token and layer, log-counts, the feed-forward
    score per query token, summed; linear with the mean [CLS]."""
    whole, pooled = _whole_matrices(model, chunks, torch.float32)  # bin edges: the graph's float32 similarities
    index = ((whole + 1.000001) / 2.0 * (HISTOGRAM_BINS - 1)).int().long()  # CEDR's binning
    counts = torch.nn.functional.one_hot(index, HISTOGRAM_BINS).sum(2).double()  # [layers, Q, bins]
    histograms = torch.log(counts + 1e-5).permute(1, 0, 2).reshape(whole.shape[1], -1)
    per_token = head.out(torch.relu(head.hidden(histograms.float()))).double().sum()
    return float(per_token + pooled.mean(0) @ head.head.weight[0].double() + head.head.bias[0])


def _reference_model1(model, translation, chunks):
    """Model 1: log P(q|D) = sum_q log(sum_d T(q|d) / |D|) over the whole document's tokens."""
    t_all = []
    for ids, q, (start, end) in chunks:
        states, _ = _hidden(model, ids, q)
        last = states[-1][0]
        t_all.append(translation(last[None, 1:1 + q], last[None, start:end])[0].double())
    t = torch.cat(t_all, dim=1)
    return float(torch.log(t.sum(1) / t.shape[1]).sum())


class _WithPooled(torch.nn.Module):
    """The HF classifier, exposing the [CLS] pooler output its classifier reads."""

    def __init__(self, checkpoint):
        super().__init__()
        from transformers import AutoModelForSequenceClassification

        self.model = AutoModelForSequenceClassification.from_pretrained(checkpoint, attn_implementation="eager").eval()

    def __call__(self, **kwargs):
        out = self.model.bert(**kwargs)
        out.pooled_cls = out.pooler_output
        return out


def _served(models, strategy):
    from keyrank.reranker import Reranker

    reranker = Reranker.local(models)
    ranking = reranker.rank(QUERY, DOCS, strategy=strategy)
    return reranker, {r.index: r.score for r in ranking.results}


def test_cedr_knrm_in_chunks_equals_the_reference_reading_the_whole_matrices(prepared):
    checkpoint, models = prepared
    _, head = _install(prepared, "cedr-knrm")
    reranker, served = _served(models, "cedr-knrm")
    with reranker, torch.no_grad():
        model = _WithPooled(checkpoint)
        expected = [_reference_knrm(model, chunks, head.kernels.weight[0], head.head.weight[0], head.head.bias[0])
                    for chunks in _chunks(reranker, "cedr-knrm")]
    np.testing.assert_allclose([served[i] for i in range(len(DOCS))], expected, rtol=1e-4, atol=1e-4)
    assert len(set(np.round(expected, 4))) == len(DOCS)  # the documents are told apart


def test_cedr_drmm_in_chunks_equals_the_reference_histograms_of_the_whole_matrices(prepared):
    checkpoint, models = prepared
    _, head = _install(prepared, "cedr-drmm")
    reranker, served = _served(models, "cedr-drmm")
    with reranker, torch.no_grad():
        model = _WithPooled(checkpoint)
        expected = [_reference_drmm(model, chunks, head) for chunks in _chunks(reranker, "cedr-drmm")]
    np.testing.assert_allclose([served[i] for i in range(len(DOCS))], expected, rtol=1e-4, atol=1e-4)
    assert len(set(np.round(expected, 4))) == len(DOCS)


def _reference_pacrr(model, chunks, filters, head):
    """CEDR-PACRR reading each chunk's [layers, Q, chunk tokens] similarity matrix: n x n convolutions (zero-padded
    at the ends), max over filters, then the k largest over all the document's window starts, per query token."""
    from keyrank.interaction import PACRR_K, QUERY_SLOTS

    per_chunk = []
    for ids, q, (start, end) in chunks:
        states, _ = _hidden(model, ids, q)
        sims = torch.stack([torch.nn.functional.normalize(h[0], dim=-1)[1:1 + q] @
                            torch.nn.functional.normalize(h[0], dim=-1)[start:end].T for h in states])
        per_chunk.append(torch.stack([conv(torch.nn.functional.pad(sims[None], (0, n - 1, 0, n - 1))).max(1).values[0]
                                      for n, conv in enumerate(filters.convs, start=1)], 1))  # [Q, ngrams, chunk tokens]
    kmax = torch.cat(per_chunk, dim=2).topk(PACRR_K, dim=-1).values  # [Q, ngrams, k]
    kmax = torch.nn.functional.pad(kmax, (0, 0, 0, 0, 0, QUERY_SLOTS - kmax.shape[0]))
    _, pooled = _whole_matrices(model, chunks)
    return float(head.dense(kmax.reshape(1, -1))[0, 0] + head.head(pooled.mean(0).float())[0])


def test_cedr_pacrr_in_chunks_equals_the_reference_k_max_over_the_whole_document(prepared):
    checkpoint, models = prepared
    features, head = _install(prepared, "cedr-pacrr")
    reranker, served = _served(models, "cedr-pacrr")
    with reranker, torch.no_grad():
        model = _WithPooled(checkpoint)
        expected = [_reference_pacrr(model, chunks, features.filters, head) for chunks in _chunks(reranker, "cedr-pacrr")]
    np.testing.assert_allclose([served[i] for i in range(len(DOCS))], expected, rtol=1e-4, atol=1e-4)
    assert len(set(np.round(expected, 4))) == len(DOCS)


def test_model1_in_chunks_equals_the_reference_log_likelihood_of_the_whole_document(prepared):
    checkpoint, models = prepared
    features, _ = _install(prepared, "model1")
    reranker, served = _served(models, "model1")
    with reranker, torch.no_grad():
        model = _WithPooled(checkpoint)
        expected = [_reference_model1(model, features.translation, chunks) for chunks in _chunks(reranker, "model1")]
    np.testing.assert_allclose([served[i] for i in range(len(DOCS))], expected, rtol=1e-4, atol=1e-4)
    assert len(set(np.round(expected, 3))) == len(DOCS)


def test_only_small_features_cross_from_the_graph(prepared):
    """What the graph answers per chunk is its feature vector, not its tokens' hidden states."""
    import onnxruntime as ort

    _, models = prepared
    _install(prepared, "cedr-knrm")
    session = ort.InferenceSession(str(models / "gateway" / features_file("cedr-knrm")), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["logits", "pooled"]
    assert [len(o.shape) for o in session.get_outputs()] == [2, 2]  # [N, 1], [N, F]: no sequence axis
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", "token_type_ids", "token_roles"]


def test_a_strategy_without_its_trained_parts_is_refused_naming_the_command(tmp_path, prepared):
    import shutil

    from keyrank.reranker import Reranker

    _, models = prepared
    bare = tmp_path / "bare"
    shutil.copytree(models, bare, ignore=shutil.ignore_patterns("cedr-*", "model1*"))
    with Reranker.local(bare) as reranker:
        for strategy in ("cedr-knrm", "cedr-drmm", "cedr-pacrr", "model1"):
            with pytest.raises(InvalidRequest, match=f"keyrank finetune --strategy {strategy}"):
                reranker.rank(QUERY, DOCS, strategy=strategy)
        assert reranker.rank(QUERY, DOCS, strategy="avgp").results  # the cross-encoder itself still serves


def test_keyrank_eval_scores_the_interaction_strategies_through_its_memo(prepared):
    """`keyrank eval` wraps the scorer in its memo (evaluation/memo.py); the interaction strategies score through
    it as they do served (it refused them as "not Reranker.local" before)."""
    from keyrank.evaluation.memo import MemoScorer
    from keyrank.reranker import Reranker

    _install(prepared, "cedr-knrm")
    with Reranker.local(prepared[1]) as reranker:
        served = {r.index: r.score for r in reranker.rank(QUERY, DOCS, strategy="cedr-knrm").results}
    with Reranker.local(prepared[1]) as reranker:
        reranker.scorer = MemoScorer(reranker.scorer)
        memo = {r.index: r.score for r in reranker.rank(QUERY, DOCS, strategy="cedr-knrm").results}
        assert MemoScorer(object()).with_graph is None  # a scorer without graphs still refuses them
    np.testing.assert_allclose([memo[i] for i in range(len(DOCS))], [served[i] for i in range(len(DOCS))], rtol=1e-6)


def test_embedded_triton_serves_the_interaction_graph_as_the_in_process_scorer_does(prepared):
    """Installed as `<kind>-features` in the repositories, the graph is loaded by the embedded Triton beside the
    cross-encoder, and the gateway sends it the chunks with their token roles: the same scores as in-process."""
    from keyrank.config import Settings
    from keyrank.modelserver.embedded import EmbeddedTriton
    from keyrank.prepare.interaction import write_triton_models
    from keyrank.reranker import Reranker

    _, models = prepared
    _install(prepared, "cedr-knrm")
    folders = write_triton_models(models, models / "gateway" / features_file("cedr-knrm"))
    assert sorted(f.parent.name for f in folders) == ["triton", "triton-embedded"]
    _, local = _served(models, "cedr-knrm")
    settings = Settings(model_dir=models, embedded_http_port=0, embedded_grpc_port=0, embedded_metrics_port=0)
    with EmbeddedTriton(settings=settings) as server:
        assert server.graphs == ("cedr-knrm-features",)
        with Reranker(Settings(model_dir=models, triton_url=server.grpc_url, request_timeout_s=120)) as reranker:
            ranking = reranker.rank(QUERY, DOCS, strategy="cedr-knrm")
    served = {r.index: r.score for r in ranking.results}
    np.testing.assert_allclose([served[i] for i in range(len(DOCS))], [local[i] for i in range(len(DOCS))], rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def knrm_run(tmp_path_factory):
    """`keyrank finetune --strategy cedr-knrm` on the toy data: frozen encoder, cached chunk features."""
    from keyrank.training import finetune
    from keyrank.training.recipe import TrecFiles
    from toy_judged import toy_trec

    root = tmp_path_factory.mktemp("knrm-run")
    model, trec = tiny_bert(root / "tiny-bert"), TrecFiles(*toy_trec(root))
    return finetune(model=str(model), out=root / "run", strategy="cedr-knrm", trec=trec, epochs=2, groups_per_step=2,
                    aggregator_lr=1e-2, seed=0, progress=False, threads=2, dev_max_queries=None)


def test_cedr_knrm_head_trains_on_cached_features_and_is_served_after_install(knrm_run):
    import json
    import shutil

    from keyrank.aggregators import TrainedAggregator, pad_by_document
    from keyrank.data.judged import from_trec
    from keyrank.interaction import FeatureLayout
    from keyrank.pipeline import RerankOptions
    from keyrank.reranker import Reranker
    from keyrank.training import interaction as heads
    from keyrank.training.cli import install_aggregator

    result = knrm_run
    assert result.finished and result.model_dir is None  # only the head is a deliverable
    assert result.aggregator.name == head_file("cedr-knrm") and (result.out / features_file("cedr-knrm")).exists()
    assert list((result.out / "cache").glob("features-cedr-knrm-*"))  # chunk features cached once, by the graph
    state = torch.load(result.out / "cedr-knrm.pt")
    assert state["kernels.weight"].abs().sum() > 0  # the kernel layer moved away from zero: it trained

    base = result.out / "base"
    installed = result.out / "installed"
    shutil.copytree(base, installed, ignore=shutil.ignore_patterns(features_file("cedr-knrm")))
    with Reranker.local(installed) as bare:
        with pytest.raises(InvalidRequest, match="keyrank finetune --strategy cedr-knrm"):
            bare.rank("a query", ["a document"], strategy="cedr-knrm")
    install_aggregator(result.aggregator, installed)
    config = json.loads((result.out / "training.json").read_text())["config"]
    judged = from_trec(config["trec"]["qrels"], config["trec"]["docs"], config["trec"]["queries"])[0]
    with Reranker.local(installed) as reranker:
        ranking = reranker.rank(judged.query, list(judged.texts), strategy="cedr-knrm")
        spec = reranker.pipeline.resolve(RerankOptions(strategy="cedr-knrm")).spec
        plan = reranker.pipeline.plan(judged.query, list(judged.texts), RerankOptions(strategy="cedr-knrm"))
        features = reranker.scorer_for(spec).score_sync(plan.inputs, want_pooled=True).pooled
    layout = FeatureLayout.from_json(TrainedAggregator.load(installed / "gateway" / head_file("cedr-knrm")).meta["layout"])
    module = heads.build(layout)
    module.load_state_dict(state)
    padded, mask = pad_by_document(plan.doc_of, features)
    with torch.no_grad():
        expected = module.eval()(torch.from_numpy(padded), torch.from_numpy(mask)).numpy()
    served = {r.index: r.score for r in ranking.results}
    np.testing.assert_allclose([served[i] for i in range(len(judged.texts))], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # runs the graph in every step: ~20-30 s on 2 cores
def test_model1_translation_network_trains_inside_its_graph_and_is_served_after_install(tmp_path):
    """`keyrank finetune --strategy model1`: the graph runs in every step (encoder frozen), T(q|d) learns, and the
    installed graph serves what the trained module computes."""
    import json
    import shutil

    from keyrank.data.judged import from_trec
    from keyrank.pipeline import RerankOptions
    from keyrank.prepare import interaction as graph
    from keyrank.reranker import Reranker
    from keyrank.training import finetune
    from keyrank.training.cli import install_aggregator
    from keyrank.training.recipe import TrecFiles
    from toy_judged import toy_trec

    model, trec = tiny_bert(tmp_path / "tiny-bert"), TrecFiles(*toy_trec(tmp_path))
    result = finetune(model=str(model), out=tmp_path / "run", strategy="model1", trec=trec, epochs=1, groups_per_step=2,
                      aggregator_lr=1e-2, seed=0, progress=False, threads=2, dev_max_queries=None)
    assert result.finished and result.model_dir is None
    assert (result.out / features_file("model1")).exists() and result.aggregator.name == head_file("model1")
    untrained = graph.build(model, "model1")
    state = torch.load(result.out / "state" / "latest.pt", weights_only=False)["encoder"]
    trained = {k.removeprefix("translation."): v for k, v in state.items() if k.startswith("translation.")}
    assert not torch.allclose(trained["project.weight"], untrained.translation.project.weight)  # it trained
    assert torch.equal(state["model.classifier.weight"], untrained.model.classifier.weight)  # the encoder did not

    installed = tmp_path / "installed"
    shutil.copytree(result.out / "base", installed)
    install_aggregator(result.aggregator, installed)
    config = json.loads((result.out / "training.json").read_text())["config"]
    judged = from_trec(config["trec"]["qrels"], config["trec"]["docs"], config["trec"]["queries"])[0]
    untrained.translation.load_state_dict(trained)
    with Reranker.local(installed) as reranker:
        ranking = reranker.rank(judged.query, list(judged.texts), strategy="model1")
        plan = reranker.pipeline.plan(judged.query, list(judged.texts), RerankOptions(strategy="model1"))
    chunks = [[] for _ in judged.texts]
    for ids, doc in zip(plan.inputs.ids, plan.doc_of):
        chunks[doc].append((torch.from_numpy(ids)[None], len(plan.query), (len(plan.query) + 2, len(ids) - 1)))
    with torch.no_grad():
        expected = [_reference_model1(_WithPooled(model), untrained.translation, c) for c in chunks]
    served = {r.index: r.score for r in ranking.results}
    np.testing.assert_allclose([served[i] for i in range(len(judged.texts))], expected, rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # runs the graph in every step: ~20-30 s on 2 cores
def test_cedr_pacrr_filters_train_inside_the_graph_and_the_installed_pair_serves(tmp_path):
    import shutil

    from keyrank.aggregators import TrainedAggregator, pad_by_document
    from keyrank.interaction import FeatureLayout
    from keyrank.pipeline import RerankOptions
    from keyrank.prepare import interaction as graph
    from keyrank.reranker import Reranker
    from keyrank.training import finetune
    from keyrank.training import interaction as heads
    from keyrank.training.cli import install_aggregator
    from keyrank.training.recipe import TrecFiles
    from toy_judged import toy_trec

    model, trec = tiny_bert(tmp_path / "tiny-bert"), TrecFiles(*toy_trec(tmp_path))
    result = finetune(model=str(model), out=tmp_path / "run", strategy="cedr-pacrr", trec=trec, epochs=1, groups_per_step=2,
                      aggregator_lr=1e-2, seed=0, progress=False, threads=2, dev_max_queries=None)
    assert result.finished and result.model_dir is None
    state = torch.load(result.out / "state" / "latest.pt", weights_only=False)
    torch.manual_seed(0)
    start = graph.build(model, "cedr-pacrr").filters.state_dict()
    trained = {k.removeprefix("filters."): v for k, v in state["encoder"].items() if k.startswith("filters.")}
    assert trained.keys() == start.keys() and not torch.allclose(trained["convs.1.weight"], start["convs.1.weight"])

    installed = tmp_path / "installed"
    shutil.copytree(result.out / "base", installed)
    install_aggregator(result.aggregator, installed)
    with Reranker.local(installed) as reranker:
        ranking = reranker.rank(QUERY, DOCS, strategy="cedr-pacrr")
        spec = reranker.pipeline.resolve(RerankOptions(strategy="cedr-pacrr")).spec
        plan = reranker.pipeline.plan(QUERY, DOCS, RerankOptions(strategy="cedr-pacrr"))
        features = reranker.scorer_for(spec).score_sync(plan.inputs, want_pooled=True).pooled
    head = heads.build(FeatureLayout.from_json(TrainedAggregator.load(result.aggregator).meta["layout"]))
    head.load_state_dict(torch.load(result.out / "cedr-pacrr.pt"))
    with torch.no_grad():
        expected = head.eval()(*(torch.from_numpy(a) for a in pad_by_document(plan.doc_of, features))).numpy()
    served = {r.index: r.score for r in ranking.results}
    np.testing.assert_allclose([served[i] for i in range(len(DOCS))], expected, rtol=1e-4, atol=1e-4)


def test_interaction_strategies_refuse_to_train_the_encoder():
    from pathlib import Path

    from keyrank.training.recipe import FinetuneConfig

    for kind, runs_graph in (("cedr-knrm", False), ("cedr-drmm", False), ("cedr-pacrr", True), ("model1", True)):
        assert FinetuneConfig(model="m", out=Path("o"), strategy=kind).trains_encoder is runs_graph
        with pytest.raises(ValueError, match="encoder frozen"):
            FinetuneConfig(model="m", out=Path("o"), strategy=kind, freeze_encoder=False).trains_encoder
