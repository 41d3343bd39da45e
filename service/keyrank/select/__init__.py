"""Stage 3 (keyb2 only): score each block of each document against the query.

``bm25`` (lexical, pure numpy), ``dense`` (bi-encoder in-process, ONNX Runtime)
and ``cross`` (the cross-encoder itself on Triton, driven by the reranker).
Selectors return scores; choosing blocks under the budget is the keyb2
strategy's job.
"""
