"""HTTP layer: a thin shell over ``Reranker.arank``; it knows nothing about models.

Follow a request through the files in this order:

- middleware.py: request id (``X-Request-ID`` echoed or generated), API key (before the body is
  read), body limit (413 before parsing);
- routes/: one module per client dialect (native.py: POST /rerank; jina.py: /v1/rerank; cohere.py:
  /v2/rerank; tei.py, infinity.py, openai.py), each with its record (dialect.py's ``Dialect``): parse
  (schemas/, strict types), call, shape the answer;
- ranking.py: limits (limits.py), admission (keyrank/admission.py, 429), the pipeline raced against
  the client's disconnect (cancelled -> ``client_closed``), blank documents ranked last;
- errors.py: every failure as one answer in the shape of the path's dialect and one count;
- probes.py: /healthz, /readyz, /metrics; docs.py: Swagger UI and ReDoc without a CDN;
- app.py: ``create_app`` puts them together, mounting the routes of every dialect in ``DIALECTS``.

Run: ``uvicorn keyrank.api:create_app --factory``.
"""

from keyrank.api.app import create_app

__all__ = ["create_app"]
