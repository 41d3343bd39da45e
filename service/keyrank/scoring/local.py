"""The cross-encoder in-process with ONNX Runtime: no Triton, for notebooks, tests
and small CPU deployments (``Reranker.local``). Same ``model.onnx``, same
length buckets and batches as the Triton path, so the scores are the same.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from keyrank.cores import thread_count
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
    options.intra_op_num_threads = threads or thread_count()
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_cpu_mem_arena = arena
    options.enable_mem_pattern = mem_pattern
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return options


def run_options(device: str | None = None):
    """Per-run options of every session: the arena is shrunk back when the run ends, so a burst of big
    batches leaves no peak behind (ONNX Runtime's ``memory.enable_memory_arena_shrinkage``); on the GPU
    (``device`` "cuda") its arena too."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0;gpu:0" if device == "cuda" else "cpu:0")
    return options


CUDA = "CUDAExecutionProvider"


def cuda_providers(available: Sequence[str], device_id: int = 0) -> list | None:
    """ONNX Runtime's providers for the GPU: CUDA (GPU ``device_id``; its memory arena grows by what a run
    asks, not by doubling), then the CPU for any operation CUDA lacks. None when ``available`` (what
    ``onnxruntime.get_available_providers()`` lists: the ``onnxruntime-gpu`` wheel has CUDA) has no CUDA."""
    if CUDA not in available:
        return None
    return [(CUDA, {"device_id": device_id, "arena_extend_strategy": "kSameAsRequested"}), "CPUExecutionProvider"]


def load_cuda_libraries() -> None:
    """Where onnxruntime-gpu is installed: CUDA and cuDNN loaded from the nvidia-* wheels (PyTorch's) when the
    system has none (``onnxruntime.preload_dlls``; a missing library only prints a warning)."""
    import onnxruntime as ort

    if CUDA in ort.get_available_providers() and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()


def run_bound(session, output_names: list[str], feeds: dict[str, np.ndarray], device: str, options=None) -> list[np.ndarray]:
    """``session.run`` through I/O binding: the inputs are copied to ``device`` once, the outputs are left
    there by the run and copied back once (on CUDA, ``session.run`` would stage both through its own
    host buffers). ``device`` "cuda" or "cpu" (the same path, as the tests run it)."""
    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_cpu_input(name, np.ascontiguousarray(array))
    for name in output_names:
        binding.bind_output(name, device)
    session.run_with_iobinding(binding, options)
    return binding.copy_outputs_to_cpu()


class LocalScorer(InProcessScorer):
    """An ONNX Runtime session on this process's CPU (or on the GPU: ``providers`` from ``cuda_providers``,
    runs through I/O binding), or OpenVINO's CPU plugin when ``runtime`` says so (``{"runtime": "openvino",
    "precision": "bf16"}``, the ``runtime.json`` `keyrank prepare` writes beside the served model:
    scoring/openvino.py)."""

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
        declares (all three for exports of `keyrank prepare`); which runtime runs it, as found here
        (with ONNX Runtime, ``provider``: the first provider the session really has)."""
        self.bound_device: str | None = "cuda" if self.runtime.get("provider") == CUDA else None
        """Where runs go through I/O binding (``run_bound``): the GPU; None: ``session.run``."""

    def run_batch(self, batch: Batch, want_pooled: bool) -> tuple[np.ndarray, np.ndarray | None]:
        feeds = {k: v for k, v in batch.feeds(roles="token_roles" in self.input_names).items() if k in self.input_names}
        names = ["logits", "pooled"] if want_pooled else ["logits"]
        if self.bound_device is not None:
            answer = run_bound(self.session, names, feeds, self.bound_device, run_options(self.bound_device))
        else:
            answer = self.session.run(names, feeds, run_options())
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


def cuda_scorer(version: Path, **shapes) -> tuple[LocalScorer | None, str]:
    """A ``LocalScorer`` on the GPU for the fp16 graph of ``version`` (triton-embedded-cuda-ort/<model>/1,
    prepare/ort_cuda.py), or None and why it cannot run here."""
    import onnxruntime as ort

    model = Path(version) / "model.onnx"
    if not model.is_file():
        return None, (f"{model} missing: `keyrank prepare --device cuda` writes it "
                      "(`python -m keyrank.prepare.ort_cuda` in a folder prepared before)")
    providers = cuda_providers(ort.get_available_providers())
    if providers is None:
        return None, "this onnxruntime has no CUDA provider (install onnxruntime-gpu in place of onnxruntime)"
    load_cuda_libraries()
    scorer = LocalScorer(model, providers=providers, **shapes)
    if scorer.bound_device is None:
        return None, "ONNX Runtime's CUDA provider did not start (no GPU or no CUDA libraries: its log says which)"
    return scorer, ""


def open_session(path: str | Path, *, threads: int = 0, runtime: dict | None = None,
                 providers: Sequence[str] = ("CPUExecutionProvider",)) -> tuple[object, tuple[str, ...], dict]:
    """The session of a served model as ``runtime`` asks (``runtime.json``; ONNX Runtime when None), for the
    in-process scorer and the prepare-time gate alike: (session, its input names, the runtime and
    precision it runs in here; with CUDA among ``providers``, the provider it really runs on)."""
    if (runtime or {}).get("runtime") == "openvino" and "CPUExecutionProvider" in providers and _openvino_here(path):
        from keyrank.scoring.openvino import OpenVinoSession

        session = OpenVinoSession(path, precision=runtime.get("precision", "f32"), threads=threads)
        return session, session.input_names, {"runtime": "openvino", "precision": session.precision}
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), session_options(threads), providers=list(providers))
    found = {"runtime": "onnxruntime"}
    if any((p[0] if isinstance(p, tuple) else p) == CUDA for p in providers):
        # ONNX Runtime starts without a provider that fails to load (no GPU, no CUDA libraries), with a log line only.
        found["provider"] = session.get_providers()[0]
    return session, tuple(i.name for i in session.get_inputs()), found


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
