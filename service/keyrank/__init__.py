"""keyrank: re-ranking of long documents with key-block selection on a Triton-hosted cross-encoder."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["Evidence", "RankedDocument", "Ranking", "RerankOptions", "Reranker", "Usage", "__version__"]


def __getattr__(name: str):
    # Lazy, so `import keyrank.config` (e.g. in the Triton Python backend) stays light.
    if name in ("Reranker", "RerankOptions", "Ranking", "RankedDocument", "Evidence", "Usage"):
        from keyrank import reranker

        return getattr(reranker, name)
    raise AttributeError(name)
