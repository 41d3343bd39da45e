"""The GPU variant of the embedded Triton repository (issue 10, item 1).

``keyrank.gpu.repository`` writes ``models/triton-embedded-cuda/``: the Python
backend running the cross-encoder in PyTorch on the GPU (bf16/fp16, scaled-dot-
product attention, optional CUDA graphs per shape), with the same tensors and
scores (within fp16 tolerance) as the ONNX repositories. The model code itself
is ``triton_embedded/model_torch.py`` + ``triton_embedded/torch_encoder.py``
(copied into the repository; they import nothing from keyrank).
"""
