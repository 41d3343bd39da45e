"""Prometheus metrics. Each is recorded where its state changes (the stage that
knows it), not in a wrapper; this module only declares them."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, Info

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
_TOKEN_BUCKETS = (100, 1_000, 5_000, 10_000, 50_000, 100_000, 500_000, 1_000_000, 5_000_000)

STAGE_SECONDS = Histogram(
    "keyrank_stage_seconds", "Wall time per pipeline stage of one request.", ["stage"], buckets=_LATENCY_BUCKETS
)
REQUESTS = Counter(
    "keyrank_requests_total",
    "Rerank requests by endpoint, strategy, outcome (ok, invalid, overloaded, unavailable, client_closed, error) and model (its served name; '-' before one was chosen).",
    ["endpoint", "strategy", "outcome", "model"],
)
IN_FLIGHT = Gauge("keyrank_in_flight_requests", "Rerank requests being processed.")
REQUEST_DOCUMENTS = Histogram("keyrank_request_documents", "Documents per request.", buckets=_COUNT_BUCKETS)
REQUEST_TOKENS = Histogram("keyrank_request_document_tokens", "Document tokens per request.", buckets=_TOKEN_BUCKETS)
SCORED_TOKENS = Histogram(
    "keyrank_scored_tokens", "Tokens sent to the cross-encoder per request (padding excluded).", buckets=_TOKEN_BUCKETS
)
TRUNCATED_DOCUMENTS = Counter(
    "keyrank_truncated_documents_total", "Documents the model did not read whole (firstp prefix, keyb2 blocks, capped windows, max_tokens_per_doc)."
)
EVIDENCE_BLOCK_POSITION = Histogram(
    "keyrank_evidence_block_position",
    "Index of each selected block (keyb2) or best window (maxp) in its document: the positional-bias signal.",
    ["strategy"],
    buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128, 256),
)
TRITON_BATCH_SIZE = Histogram(
    "keyrank_triton_batch_size", "Sequences per Triton request.", ["bucket"], buckets=(1, 2, 4, 8, 16, 32, 64, 128)
)
HEAVY_PREEMPTED = Counter(
    "keyrank_heavy_batches_preempted_total",
    "Heavy requests' batches cancelled in the model server's queue for a small request's batch, and sent again.",
)
TRITON_RTT = Histogram(
    "keyrank_triton_rtt_seconds", "Round trip of one Triton inference request.", ["bucket"], buckets=_LATENCY_BUCKETS
)
TRITON_ERRORS = Counter("keyrank_triton_errors_total", "Failed Triton requests by kind.", ["kind"])
CACHE_HITS = Counter("keyrank_cache_hits_total", "Cache hits: dense (block embeddings), documents (doc_cache.py).", ["cache"])
CACHE_MISSES = Counter("keyrank_cache_misses_total", "Cache misses: dense (block embeddings), documents (doc_cache.py).", ["cache"])
DOCUMENT_CACHE_BYTES = Gauge("keyrank_document_cache_bytes", "Bytes held by the document cache (tokens, blocks, BM25 terms).")
DOCUMENT_CACHE_EVICTIONS = Counter("keyrank_document_cache_evictions_total", "Documents dropped from the document cache to stay within its bound.")
QUEUED_SEQUENCES = Gauge(
    "keyrank_queued_sequences", "Estimated cross-encoder sequences admitted and not finished (admission.py)."
)
DRAIN_RATE = Gauge(
    "keyrank_drain_sequences_per_second", "Sequences per second the gateway drains while busy (moving average)."
)
MODEL_INFO = Info(
    "keyrank_model",
    "What scores each served model (api/served.py, as GET /v1/models reports it): runtime (openvino, onnxruntime, torch, tensorrt), precision (bfloat16, float16, float32, int8) and device (cpu, cuda); unknown where a model server does not say.",
    ["model"],
)
"""Exposed as ``keyrank_model_info{model, runtime, precision, device} 1``."""
