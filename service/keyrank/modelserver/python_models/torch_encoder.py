"""The cross-encoder in PyTorch for the embedded repository's GPU variant: fp16/bf16,
scaled-dot-product attention, optional CUDA graphs per (batch, width) shape.

Copied next to ``model_torch.py`` (as ``torch_encoder.py``) by ``keyrank.prepare.gpu_repository``;
it runs inside Triton's Python stub and in tests, so it imports nothing from keyrank.
Answers the same tensors as the ONNX export: ``logits`` [N, labels] and ``pooled``
[N, H] = what the final Linear reads (BERT's pooler output, RoBERTa's dense+tanh
features, ...), or for yes/no decoder rerankers logit(yes) - logit(no) at the last
real token and that token's hidden state. ``encoder.json`` beside the checkpoint
says which (written from the manifest by ``keyrank prepare``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger("keyrank.torch_encoder")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _pad_rows(n: int) -> int:
    """Batch rows a CUDA graph is captured for: powers of two, so a few graphs serve every batch."""
    return 1 << max(0, (n - 1).bit_length())


class TorchCrossEncoder:
    """``(logits, pooled)`` float32 numpy of int64 ``[N, L]`` inputs, on ``device`` in ``dtype``."""

    def __init__(self, folder: str | Path, *, device: str = "cuda", dtype: str = "bfloat16", cuda_graphs: bool = False, max_graphs: int = 64,
                 compiled: bool = False):
        from transformers import (
            AutoModelForCausalLM,
            AutoModelForSequenceClassification,
        )

        folder = Path(folder)
        spec = json.loads((folder / "encoder.json").read_text())
        self.device = torch.device(device)
        """Where the model runs."""
        self.dtype = DTYPES[dtype]
        """Weights and activations (fp32 accumulation inside the matmuls either way)."""
        self.decoder: bool = bool(spec.get("decoder"))
        """A yes/no decoder reranker (else a sequence classifier)."""
        self.uses_token_types: bool = bool(spec.get("uses_token_type_ids", True))
        """Segment ids are passed only to models that learned them (as the ONNX export does)."""
        auto = AutoModelForCausalLM if self.decoder else AutoModelForSequenceClassification
        try:
            model = auto.from_pretrained(folder / "checkpoint", dtype=self.dtype, attn_implementation="sdpa")
        except (TypeError, ValueError):  # a family without an SDPA implementation: its default attention
            model = auto.from_pretrained(folder / "checkpoint", dtype=self.dtype)
        self.model = model.to(self.device).eval()
        """The Hugging Face model."""
        if self.decoder:
            yes, no = spec["yes_no"]
            weight = self.model.get_output_embeddings().weight
            self._direction = (weight[yes] - weight[no]).detach().clone()[None]
        else:
            self._seen: list[torch.Tensor] = []
            head = self.model.get_submodule(spec["head"])
            head.register_forward_hook(lambda _m, inputs, _out: self._seen.append(inputs[0]))
        if compiled:
            # The transformer body through torch.compile (inductor fuses the bias, GELU, layer-norm and cast kernels a
            # narrow model spends much of its time in); shapes symbolic, so new batch sizes and widths do not recompile.
            # The head stays eager: its input is the pooled vector this class returns.
            self.model.base_model.forward = torch.compile(self.model.base_model.forward, dynamic=True)
        self.compiled: bool = compiled
        """The body runs compiled (the first batch pays the compilation)."""
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        """Replay captured graphs per (rows, width) instead of launching every kernel from Python."""
        self.max_graphs = max_graphs
        """Most graphs kept; shapes beyond run eagerly."""
        self._graphs: dict[tuple[int, int], tuple] = {}
        self._pool = None
        self._graphs_failed = False

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tensors in, tensors out (on the device, in the model's dtype)."""
        if self.decoder:
            hidden = self.model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            last = attention_mask.sum(1) - 1
            pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
            return pooled @ self._direction.T, pooled
        self._seen.clear()
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.uses_token_types:
            kwargs["token_type_ids"] = token_type_ids
        logits = self.model(**kwargs).logits
        return logits, self._seen[-1]

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray, token_type_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n, width = input_ids.shape
        graph = self._graph(n, width) if self.cuda_graphs and not self._graphs_failed else None
        if graph is not None:
            logits, pooled = self._replay(graph, n, input_ids, attention_mask, token_type_ids)
        else:
            tensors = [torch.from_numpy(np.ascontiguousarray(a)).to(self.device, non_blocking=True) for a in (input_ids, attention_mask, token_type_ids)]
            logits, pooled = self.forward(*tensors)
        return logits.float().cpu().numpy(), pooled.float().cpu().numpy()

    # --- CUDA graphs ---------------------------------------------------------------------------
    def _graph(self, n: int, width: int):
        key = (_pad_rows(n), width)
        if key in self._graphs:
            return self._graphs[key]
        if len(self._graphs) >= self.max_graphs:
            return None
        rows = key[0]
        static = [torch.zeros((rows, width), dtype=torch.long, device=self.device) for _ in range(3)]
        static[1][:, 0] = 1  # padding rows attend to one token: no all-masked row, no NaN
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up outside the graph (cuBLAS handles, lazy inits)
                    self.forward(*static)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                outputs = self.forward(*static)
            self._pool = graph.pool()
        except Exception as exc:  # noqa: BLE001 -- a model whose forward syncs on data (e.g. mask checks) cannot be captured
            log.warning("CUDA graph capture failed for %s (%s): running eagerly", key, exc)
            self._graphs_failed = True
            return None
        self._graphs[key] = (graph, static, outputs)
        return self._graphs[key]

    def _replay(self, graph, n: int, *arrays: np.ndarray):
        captured, static, (logits, pooled) = graph
        for buffer, array in zip(static, arrays):
            buffer[:n].copy_(torch.from_numpy(np.ascontiguousarray(array)), non_blocking=True)
            if n < buffer.shape[0]:
                buffer[n:].zero_()
        static[1][n:, 0] = 1
        captured.replay()
        return logits[:n], pooled[:n]


def flops_per_sequence(config: dict, width: int) -> float:
    """Forward FLOPs of one sequence of ``width`` tokens (2 per multiply-add): the encoder's matmuls
    (QKV, output, FFN) and attention (QK^T, AV); embeddings, norms and the head are negligible."""
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    ffn = config.get("intermediate_size", 4 * h)
    per_layer = 2 * width * (4 * h * h + 2 * h * ffn) + 2 * 2 * width * width * h
    return float(layers * per_layer)
