"""Prepare time (``keyrank prepare``): a Hugging Face checkpoint becomes what serving reads.

Runs once per model, never on the request path, and needs the ``export`` extra
(PyTorch, transformers). In reading order:

- ``export``: the command: lock, fingerprints, the manifest, the repositories.
- ``cross_encoder``: the reranker to ONNX (``logits`` + ``pooled``), its template
  derived from the tokenizer, and the ONNX-vs-PyTorch parity check.
- ``variants``: the CPU model both CPU paths load (fused by default, int8 on request) and the
  quality gate that refuses a variant ranking differently from fp32.
- ``bi_encoder``: all-MiniLM-L6-v2 to ONNX for the dense selector, with its check.
- ``repositories``: the Triton repositories (``triton/`` for the onnxruntime backend,
  ``triton-embedded/`` for the Python backend on CPU); ``gpu_repository``: their GPU
  variant (``triton-embedded-cuda/``, PyTorch in the Python backend), also run on its own
  for an already prepared directory.
"""
