"""Hugging Face text-embeddings-inference (TEI): POST /tei/rerank, GET /tei/info, and TEI's error answer."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, RootModel, field_validator

from keyrank.schemas.common import (
    EXAMPLE_DOCS,
    EXAMPLE_QUERY,
    Coverage,
    VendorRequest,
    Wire,
    non_blank,
    query_field,
)


class TeiRerankRequest(VendorRequest):
    """POST /tei/rerank: text-embeddings-inference's rerank request, ranked with the default strategy and selector."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"query": EXAMPLE_QUERY, "texts": EXAMPLE_DOCS, "raw_scores": False}]})
    ignored_when_sent: ClassVar[frozenset[str]] = frozenset({"truncate", "truncation_direction"})

    query: str = query_field()
    """The search query, non-blank; same limits as POST /rerank."""
    texts: list[str] = Field(min_length=1, examples=[EXAMPLE_DOCS])
    """The documents; same limits as POST /rerank's documents (a limit names them ``documents[i]``)."""
    raw_scores: bool = False
    """false (TEI's default): the sigmoid of keyrank's score, in (0, 1); true: keyrank's score itself (the
    cross-encoder's logit scale). The order is the same."""
    return_text: bool = False
    """Echo each result's text."""
    model: str | None = None
    """keyrank's extension (TEI serves one model per server). With several models served (KEYRANK_MODELS) it picks one by name (GET /v1/models lists them); unset = the default, another name = 422 listing them. With one model served: listed as
    ignored when it names another."""
    truncate: bool | None = None
    """TEI: accepted and ignored; keyrank never refuses a long text, its strategy decides what is read
    (each result's truncated/read_tokens say how much, with return_evidence)."""
    truncation_direction: Literal["Left", "Right", "left", "right"] | None = None
    """TEI: accepted and ignored; long texts are read by the strategy, not cut from one end."""
    return_evidence: bool = False
    """keyrank's extension: add each result's evidence spans and coverage (evidence, truncated, read_tokens,
    document_tokens); clients that do not know these fields still parse the answer."""

    _query_not_blank = field_validator("query")(non_blank)


class TeiRank(Coverage):
    """One ranked text, TEI's shape (plus keyrank's fields with return_evidence)."""

    index: int
    """Position of the text in the request."""
    score: float
    """sigmoid of keyrank's score, or the score itself with raw_scores."""
    text: str | None = None
    """The text; with return_text."""


class TeiRerankResponse(RootModel[list[TeiRank]]):
    """POST /tei/rerank answer: every text, best first (TEI has no top_n)."""


class TeiReranker(Wire):
    """TEI's model type of a reranker: its labels."""

    id2label: dict[str, str]
    """Label of each output (one: the relevance logit)."""
    label2id: dict[str, int]
    """The inverse map."""


class TeiModelType(Wire):
    """TEI's model_type: this server is a reranker."""

    reranker: TeiReranker
    """The reranker's labels."""


class TeiInfo(Wire):
    """GET /tei/info: TEI's router info, with keyrank's values."""

    model_id: str
    """The served model (KEYRANK_MODEL_NAME, else the prepared model's hub id or folder name); with several
    (KEYRANK_MODELS), the default one."""
    models: list[str]
    """keyrank's extension: every served model's name, the default first (a request's ``model`` picks one)."""
    model_sha: str | None = None
    """Not tracked: null."""
    model_dtype: str
    """What the default model computes in, as it serves now (api/served.py): ``bfloat16`` (OpenVINO on a CPU with
    bf16, the PyTorch GPU variant), ``float16`` (TensorRT, ONNX Runtime's CUDA graph), ``float32``, ``int8``, or
    ``unknown`` (an external Triton that does not say)."""
    model_type: TeiModelType
    """Always a reranker."""
    max_concurrent_requests: int
    """Triton requests in flight at once (KEYRANK_TRITON_MAX_IN_FLIGHT x KEYRANK_WORKERS); more wait in the
    admission queue, past it 429."""
    max_input_length: int
    """Longest model input in tokens (KEYRANK_MAX_SEQUENCE_LENGTH); longer texts are read by the strategy."""
    max_batch_tokens: int
    """Tokens per Triton batch: KEYRANK_TRITON_BATCH_SIZE x max_input_length."""
    max_batch_requests: int | None = None
    """No such limit: null."""
    max_client_batch_size: int
    """Most texts per request (KEYRANK_MAX_DOCUMENTS)."""
    auto_truncate: bool = True
    """Always true: a long text is never refused."""
    tokenization_workers: int
    """Gateway worker processes (KEYRANK_WORKERS)."""
    version: str
    """keyrank's version."""
    sha: str | None = None
    """Not tracked: null."""
    docker_label: str | None = None
    """Not tracked: null."""


class TeiErrorResponse(Wire):
    """4xx/5xx of /tei/*, TEI's shape."""

    error: str
    """What went wrong (TEI's field)."""
    error_type: str
    """TEI's error kind: Validation (4xx from the request), Overloaded (429), Unhealthy (503), Backend (500)."""
    field: str | None = None
    """The request field at fault."""
    request_id: str | None = None
    """Quote it when reporting a problem; it is in the server's log."""
