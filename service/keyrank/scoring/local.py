"""The cross-encoder in-process with ONNX Runtime: no Triton, for notebooks, tests
and small CPU deployments (``Reranker.local``). Same ``model.onnx``, same
length buckets and batches as the Triton path, so the scores are the same.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from keyrank.scoring import Batch
from keyrank.scoring.buckets import LENGTH_BUCKETS, LENGTH_MULTIPLE
from keyrank.scoring.in_process import InProcessScorer


def session_options(threads: int = 0, *, arena: bool = True, mem_pattern: bool = False, spinning: bool = True):
    """The ONNX Runtime options of every CPU session of the cross-encoder, set on purpose (measured in
    docs/PERFORMANCE.md, "ONNX Runtime session options"); the embedded Triton model sets the same ones.

    - threads: ``threads`` or this process's usable cores for the ops (intra-op), one inter-op thread,
      sequential execution: a BERT graph is one chain, its parallelism is inside the MatMuls.
    - graph optimisation: all of ONNX Runtime's (constant folding, fusions, NCHWc layouts) at load.
    - arena on, given back after every run (``run_options``: the arena shrinks to nothing when a run
      ends), memory pattern off: on an idle machine the arena is worth 1.5x on 512-token batches
      (10.2 vs 6.8 pairs/s) and, shrunk per run, the process keeps ~200 MB after a [64 x 512] batch
      where a kept arena held 2 GB (2.37 GB after maxp bursts, docs/RELIABILITY.md).
    - spinning: intra-op threads spin-wait between ops (ONNX Runtime's default); off trades latency
      for CPU left to other processes.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or len(os.sched_getaffinity(0))
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_cpu_mem_arena = arena
    options.enable_mem_pattern = mem_pattern
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return options


def run_options():
    """Per-run options of every CPU session: the arena is shrunk back when the run ends, so a burst of
    big batches leaves no peak behind (ONNX Runtime's ``memory.enable_memory_arena_shrinkage``)."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


class LocalScorer(InProcessScorer):
    """An ONNX Runtime session on this process's CPU (or a CUDA provider when asked), or OpenVINO's CPU
    plugin when ``runtime`` says so (``{"runtime": "openvino", "precision": "bf16"}``, the
    ``runtime.json`` `keyrank prepare` writes beside the served model: scoring/openvino.py)."""

    def __init__(
        self,
        onnx_path: str | Path,
        *,
        pad_id: int,
        buckets: Sequence[int] = LENGTH_BUCKETS,
        batch_size: int = 32,
        threads: int = 0,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        max_shapes: int = 0,
        multiple: int = LENGTH_MULTIPLE,
        long_buckets: Sequence[int] = (),
        runtime: dict | None = None,
    ) -> None:
        super().__init__(pad_id=pad_id, buckets=buckets, batch_size=batch_size, max_shapes=max_shapes, multiple=multiple,
                         long_buckets=long_buckets)
        self.threads: int = threads
        """ONNX Runtime intra-op threads (0 = this process's cores)."""
        self.session, self.input_names, self.runtime = open_session(onnx_path, threads=threads, runtime=runtime, providers=providers)
        """The ONNX Runtime session (or an ``OpenVinoSession``, which runs alike); the inputs the graph
        declares (all three for exports of `keyrank prepare`); which runtime runs it, as found here."""

    def run_batch(self, batch: Batch, want_pooled: bool) -> tuple[np.ndarray, np.ndarray | None]:
        feeds = {k: v for k, v in batch.feeds(roles="token_roles" in self.input_names).items() if k in self.input_names}
        answer = self.session.run(["logits", "pooled"] if want_pooled else ["logits"], feeds, run_options())
        return answer[0], (answer[1] if want_pooled else None)

    def with_graph(self, onnx_path: str | Path, model: str | None = None) -> LocalScorer:
        """The same buckets, batches and threads on another graph (an interaction graph, models/gateway/); ``model``,
        its name on a model server, means nothing here."""
        scorer = LocalScorer(onnx_path, pad_id=self.pad_id, buckets=self.buckets, batch_size=self.batch_size,
                             threads=self.threads, long_buckets=self.long_buckets, **self.shapes)
        return scorer

    @property
    def closed(self) -> bool:
        return self.session is None

    async def close(self) -> None:
        self.session = None  # type: ignore[assignment]


def open_session(path: str | Path, *, threads: int = 0, runtime: dict | None = None,
                 providers: Sequence[str] = ("CPUExecutionProvider",)) -> tuple[object, tuple[str, ...], dict]:
    """The session of a served CPU model as ``runtime`` asks (``runtime.json``; ONNX Runtime when None),
    for the in-process scorer and the prepare-time gate alike: (session, its input names, the runtime
    and precision it runs in here)."""
    if (runtime or {}).get("runtime") == "openvino" and "CPUExecutionProvider" in providers and _openvino_here(path):
        from keyrank.scoring.openvino import OpenVinoSession

        session = OpenVinoSession(path, precision=runtime.get("precision", "f32"), threads=threads)
        return session, session.input_names, {"runtime": "openvino", "precision": session.precision}
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), session_options(threads), providers=list(providers))
    return session, tuple(i.name for i in session.get_inputs()), {"runtime": "onnxruntime"}


def _openvino_here(onnx_path: str | Path) -> bool:
    """OpenVINO is installed; else the model runs on ONNX Runtime, said in the log: the fp32 export (which
    openvino and openvino-bf16 serve unchanged) with fp32's scores, openvino-int8's QDQ graph in int8."""
    from keyrank.scoring.openvino import available

    if available():
        return True
    logging.getLogger(__name__).warning(
        "%s was prepared for OpenVINO, which is not installed (pip install 'keyrank[embedded]'): "
        "running it on ONNX Runtime", onnx_path)
    return False
