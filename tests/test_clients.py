"""Drop-in: the vendors' own client libraries, pointed at the live gateway, rank as they would on
Jina's or Cohere's service: the cohere SDK (ClientV2 and the v1 Client), langchain-cohere,
llama-index's Cohere and Jina postprocessors, and the rerankers library's API rankers.

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
