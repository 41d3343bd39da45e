"""Drop-in: the vendors' own client libraries, pointed at the live gateway, rank as they would on
Jina's, Cohere's, TEI's or Infinity's service: the cohere SDK (ClientV2 and the v1 Client), langchain-cohere,
llama-index's Cohere, Jina and TEI postprocessors, the rerankers library's API rankers (Cohere, Jina, TEI),
Infinity's generated ``infinity_client`` and the OpenAI SDK's model list. Asked for evidence
(``return_evidence``), each still parses the answer.

Each client needs only its base URL changed (``pip install .[clients]``).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.triton

cohere = pytest.importorskip("cohere", reason="client SDKs: pip install -e '.[clients]'")

QUERY = "what is a cat"
DOCS = [
    "The stock market fell sharply on Monday. Investors sold bank shares.",
    "A cat is an animal. Cats are small carnivorous mammals kept as pets.",
    "Paris is the capital of France.",
]
CAT = 1
KEY = "any-key"  # the session's gateway has no API key; clients insist on sending one


def _is_ranking(indices: list[int], scores: list[float], n: int) -> None:
    assert indices[0] == CAT, indices
    assert len(indices) == n and len(set(indices)) == n
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 <= s <= 1.0 for s in scores)


# --------------------------------------------------------------------------- cohere SDK


def test_cohere_client_v2_reranks_with_every_field_it_sends(gateway_url):
    client = cohere.ClientV2(api_key=KEY, base_url=gateway_url)
    response = client.rerank(
        model="rerank-v3.5", query=QUERY, documents=DOCS, top_n=2, max_tokens_per_doc=4096, priority=1
    )
    _is_ranking([r.index for r in response.results], [r.relevance_score for r in response.results], 2)
    assert response.meta.api_version.version == "2"


def test_cohere_v1_client_reranks_object_documents_by_rank_fields(gateway_url):
    client = cohere.Client(api_key=KEY, base_url=gateway_url)
    documents = [{"title": f"doc {i}", "body": text} for i, text in enumerate(DOCS)]
    response = client.rerank(
        model="rerank-english-v3.0", query=QUERY, documents=documents, top_n=3,
        rank_fields=["title", "body"], return_documents=True, max_chunks_per_doc=10,
    )
    _is_ranking([r.index for r in response.results], [r.relevance_score for r in response.results], 3)
    assert response.results[0].document.model_dump()["body"] == DOCS[CAT]  # the object comes back as sent


def test_cohere_sdk_raises_its_own_error_with_the_message(gateway_url):
    client = cohere.ClientV2(api_key=KEY, base_url=gateway_url)
    with pytest.raises(cohere.core.api_error.ApiError) as raised:
        client.rerank(model="rerank-v3.5", query="   ", documents=DOCS)
    assert raised.value.status_code == 422
    assert "query" in raised.value.body["message"]


# --------------------------------------------------------------------------- LangChain


def test_langchain_cohere_rerank_compresses_documents(gateway_url):
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    reranker = CohereRerank(cohere_api_key=KEY, base_url=gateway_url, model="rerank-v3.5", top_n=2)
    kept = reranker.compress_documents([Document(page_content=text) for text in DOCS], QUERY)
    assert kept[0].page_content == DOCS[CAT] and len(kept) == 2
    scores = [d.metadata["relevance_score"] for d in kept]
    assert scores == sorted(scores, reverse=True)


# --------------------------------------------------------------------------- LlamaIndex


def _nodes():
    from llama_index.core.schema import NodeWithScore, TextNode

    return [NodeWithScore(node=TextNode(text=text), score=0.0) for text in DOCS]


def test_llama_index_cohere_rerank_postprocesses_nodes(gateway_url):
    from llama_index.postprocessor.cohere_rerank import CohereRerank

    reranker = CohereRerank(api_key=KEY, base_url=gateway_url, model="rerank-v3.5", top_n=2)
    nodes = reranker.postprocess_nodes(_nodes(), query_str=QUERY)
    assert nodes[0].node.get_content() == DOCS[CAT] and len(nodes) == 2


def test_llama_index_jina_rerank_postprocesses_nodes(gateway_url):
    from llama_index.postprocessor.jinaai_rerank import JinaRerank

    reranker = JinaRerank(api_key=KEY, base_url=f"{gateway_url}/v1", model="jina-reranker-v2-base-multilingual", top_n=2)
    nodes = reranker.postprocess_nodes(_nodes(), query_str=QUERY)
    assert nodes[0].node.get_content() == DOCS[CAT] and len(nodes) == 2


def test_llama_index_jina_rerank_reads_the_error_detail(gateway_url):
    from llama_index.postprocessor.jinaai_rerank import JinaRerank

    reranker = JinaRerank(api_key=KEY, base_url=f"{gateway_url}/v1", top_n=2)
    with pytest.raises(RuntimeError, match="KEYRANK_MAX_QUERY_CHARS"):  # Jina clients raise resp["detail"]
        reranker.postprocess_nodes(_nodes(), query_str="cat " * 1_000)


# --------------------------------------------------------------------------- rerankers


@pytest.mark.parametrize(("provider", "path"), [("cohere", "/v2/rerank"), ("cohere", "/v1/rerank"), ("jina", "/v1/rerank")])
def test_rerankers_api_ranker_ranks(gateway_url, provider, path):
    from rerankers import Reranker

    ranker = Reranker("rerank-v3.5", model_type=provider, api_key=KEY, url=f"{gateway_url}{path}", verbose=0)
    ranked = ranker.rank(QUERY, DOCS)
    top = ranked.top_k(3)
    assert top[0].document.text == DOCS[CAT]
    assert [r.score for r in top] == sorted((r.score for r in top), reverse=True)


# --------------------------------------------------------------------------- TEI (text-embeddings-inference)


def _tei_client():
    pytest.importorskip("llama_index.postprocessor.tei_rerank", reason="client SDKs: pip install -e '.[clients]'")
    from llama_index.postprocessor.tei_rerank import TextEmbeddingInference

    return TextEmbeddingInference


def test_llama_index_tei_rerank_postprocesses_nodes(gateway_url):
    reranker = _tei_client()(base_url=f"{gateway_url}/tei", top_n=2, auth_token=f"Bearer {KEY}")
    nodes = reranker.postprocess_nodes(_nodes(), query_str=QUERY)
    assert nodes[0].node.get_content() == DOCS[CAT] and len(nodes) == 2
    assert nodes[0].score > nodes[1].score and 0.0 <= nodes[1].score <= nodes[0].score <= 1.0


def test_rerankers_tei_ranker_ranks(gateway_url):
    from rerankers import Reranker

    ranker = Reranker("ce-minilm-l6", model_type="text-embeddings-inference", api_key=KEY, url=f"{gateway_url}/tei/rerank", verbose=0)
    top = ranker.rank(QUERY, DOCS).top_k(3)
    assert top[0].document.text == DOCS[CAT]
    assert [r.score for r in top] == sorted((r.score for r in top), reverse=True)


# --------------------------------------------------------------------------- Infinity


def _infinity():
    return pytest.importorskip("infinity_client", reason="client SDKs: pip install -e '.[clients]'")


def test_infinity_client_reranks_and_lists_the_model(gateway_url):
    _infinity()
    from infinity_client import AuthenticatedClient
    from infinity_client.api.default import models, rerank
    from infinity_client.models import ReRankResult, RerankInput

    client = AuthenticatedClient(base_url=f"{gateway_url}/infinity", token=KEY, raise_on_unexpected_status=True)
    with client:
        answer = rerank.sync(client=client, body=RerankInput(query=QUERY, documents=DOCS, return_documents=True, top_n=2))
        listed = models.sync(client=client)
    assert isinstance(answer, ReRankResult), answer
    _is_ranking([r.index for r in answer.results], [r.relevance_score for r in answer.results], 2)
    assert answer.results[0].document == DOCS[CAT] and answer.model == "ce-minilm-l6"
    assert answer.usage.total_tokens > 0 and not answer.results[0].additional_properties  # nothing asked, nothing extra
    assert [m.id for m in listed.data] == ["ce-minilm-l6"]


def test_infinity_client_parses_our_422_as_its_validation_error(gateway_url):
    _infinity()
    from infinity_client import Client
    from infinity_client.api.default import rerank
    from infinity_client.models import HTTPValidationError, RerankInput

    with Client(base_url=f"{gateway_url}/infinity") as client:
        answer = rerank.sync(client=client, body=RerankInput(query="   ", documents=DOCS))
    assert isinstance(answer, HTTPValidationError)
    assert answer.detail[0].loc == ["body", "query"] and "non-whitespace" in answer.detail[0].msg


# --------------------------------------------------------------------------- OpenAI-style discovery


def test_openai_sdk_lists_the_served_model(gateway_url):
    openai = pytest.importorskip("openai", reason="client SDKs: pip install -e '.[clients]'")

    listed = openai.OpenAI(api_key=KEY, base_url=f"{gateway_url}/v1").models.list()
    assert [m.id for m in listed.data] == ["ce-minilm-l6"] and listed.data[0].owned_by == "keyrank"


# --------------------------------------------------------------------------- evidence: asked for, parsed by every client

EXTENSION = {"evidence", "truncated", "read_tokens", "document_tokens"}


def _is_evidence_of(extra: dict, document: str) -> None:
    """The extension fields of one result: spans inside the document, its coverage."""
    assert EXTENSION <= set(extra), extra
    assert extra["evidence"] and all(0 <= e["start"] < e["end"] <= len(document) for e in extra["evidence"])
    assert extra["read_tokens"] == extra["document_tokens"] > 0 and extra["truncated"] is False  # short documents: read whole


def test_cohere_sdk_asks_for_evidence_and_still_parses_the_answer(gateway_url):
    asked = {"additional_body_parameters": {"return_evidence": True}}
    v2 = cohere.ClientV2(api_key=KEY, base_url=gateway_url).rerank(
        model="ce-minilm-l6", query=QUERY, documents=DOCS, top_n=2, request_options=asked)
    v1 = cohere.Client(api_key=KEY, base_url=gateway_url).rerank(
        model="ce-minilm-l6", query=QUERY, documents=DOCS, top_n=2, request_options=asked)
    for response in (v2, v1):
        _is_ranking([r.index for r in response.results], [r.relevance_score for r in response.results], 2)
        for result in response.results:
            _is_evidence_of(result.model_dump(), DOCS[result.index])


def test_jina_shape_with_evidence_is_parsed_by_the_rerankers_jina_ranker(gateway_url):
    import json

    from rerankers.models.api_rankers import APIRanker

    class AskingForEvidence(APIRanker):  # the client's own request and parser, plus the extension field
        def _format_payload(self, query, docs):
            return json.dumps({**json.loads(super()._format_payload(query, docs)), "return_evidence": True})

        def _parse_response(self, response, docs):
            for result in response["results"]:
                _is_evidence_of(result, DOCS[result["index"]])
            return super()._parse_response(response, docs)

    ranker = AskingForEvidence("jina-reranker-v2-base-multilingual", KEY, "jina", verbose=0, url=f"{gateway_url}/v1/rerank")
    top = ranker.rank(QUERY, DOCS).top_k(3)
    assert top[0].document.text == DOCS[CAT]
    assert [r.score for r in top] == sorted((r.score for r in top), reverse=True)


def test_tei_client_with_evidence_still_ranks(gateway_url):
    import httpx

    class AskingForEvidence(_tei_client()):  # the client's own request, plus the extension field
        def _call_api(self, query, texts):
            answer = httpx.post(f"{self.base_url}/rerank", json={"query": query, "texts": texts, "return_evidence": True}).json()
            for result in answer:
                _is_evidence_of(result, texts[result["index"]])
            return answer

    nodes = AskingForEvidence(base_url=f"{gateway_url}/tei", top_n=2).postprocess_nodes(_nodes(), query_str=QUERY)
    assert nodes[0].node.get_content() == DOCS[CAT] and len(nodes) == 2


def test_infinity_client_sends_the_extension_field_and_keeps_the_answer(gateway_url):
    _infinity()
    from infinity_client import Client
    from infinity_client.api.default import rerank
    from infinity_client.models import RerankInput

    body = RerankInput(query=QUERY, documents=DOCS)
    body["return_evidence"] = True  # the generated client's additional_properties: sent as a field
    with Client(base_url=f"{gateway_url}/infinity") as client:
        answer = rerank.sync(client=client, body=body)
    _is_ranking([r.index for r in answer.results], [r.relevance_score for r in answer.results], 3)
    for result in answer.results:
        _is_evidence_of(result.additional_properties, DOCS[result.index])
