"""The model server: the Triton process keyrank runs, watches and repairs.

Nothing on the request path imports this package except to start or reach it
(``Reranker.embedded``, ``keyrank serve``). In reading order:

- ``launcher``: ``keyrank serve``: the embedded Triton, then the gateway's workers.
- ``embedded``: ``EmbeddedTriton``: the ``tritonserver`` of the nvidia-pytriton
  wheel: spawn, readiness, restart, stop, log tail.
- ``arguments``: the wheel's server and backend, free ports, the environment.
- ``workdir``: its private work dir and the lock that owns it; ``leftovers``: what a
  killed server left, removed by the next one.
- ``process``: the tritonserver child, in its own process group, dead with its parent.
- ``supervision``: health checks of the model process and its repairs.
- ``admin``: Triton's HTTP endpoint (health, repository, statistics, a probe inference), one client for all of them.
- ``guard``: the sidecar that answers for the model path next to an external Triton.
- ``repository``: what a prepared repository holds (the model's name, its tensors, the
  code beside it), and the repository the embedded Triton serves from prepared folders.
- ``gpu_gateway``: the gateway scoring in-process on a GPU, without Triton.
- ``python_models/``: the Python-backend models `keyrank prepare` copies into a repository
  (``model.py``: ONNX Runtime; ``model_torch.py`` + ``torch_encoder.py``: PyTorch).

The repositories themselves are written at prepare time (``keyrank.prepare.repositories``,
``keyrank.prepare.gpu_repository``).
"""
