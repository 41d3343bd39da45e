"""What both Python-backend models do with a dynamic batch: skip the cancelled, group, run, split back.

Copied beside ``model.py`` into each repository (as ``torch_encoder.py`` is for
the GPU variant); it runs inside Triton's Python stub and imports nothing from
keyrank. Triton's dynamic batcher hands ``execute`` several requests; those with
equal shapes (the gateway pads to length buckets) run as one batch, and the
outputs are split back per request. One bad group does not fail the others.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import triton_python_backend_utils as pb_utils


# The Python stubs of nvidia-pytriton 0.7 predate numpy 2 (pybind11 reads the item size from numpy 1's dtype
# layout): under numpy 2, ``as_numpy()`` gives inputs zero strides and ``pb_utils.Tensor(name, array)`` an empty
# buffer. DLPack carries shape, strides and type itself, so inputs always come in through it, and outputs go out
# through it under numpy 2 (numpy 1 names DLPack's capsules differently from the stub, so there the array goes).
NUMPY2 = int(np.__version__.split(".")[0]) >= 2


def _tensor(name: str, array: np.ndarray):
    array = np.ascontiguousarray(array)
    return pb_utils.Tensor.from_dlpack(name, array) if NUMPY2 else pb_utils.Tensor(name, array)


def execute_grouped(requests: list, input_names: Sequence[str], output_names: Sequence[str],
                    run: Callable[[dict, list], Sequence[np.ndarray]]) -> list:
    """One response per request. ``run(batch, batch_requests)`` returns the outputs of one equal-shape
    batch (``{input name: [n, L] array}``), in ``output_names`` order."""
    responses: list = [None] * len(requests)
    live = []
    for index, request in enumerate(requests):
        if request.is_cancelled():  # the gateway cancels when its caller hangs up: not run
            responses[index] = pb_utils.InferenceResponse(
                output_tensors=[], error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
            )
        else:
            live.append(index)
    feeds = {
        index: {name: np.from_dlpack(pb_utils.get_input_tensor_by_name(requests[index], name)) for name in input_names}
        for index in live
    }
    groups: dict[tuple, list[int]] = {}
    for index, feed in feeds.items():
        groups.setdefault(tuple(feed[name].shape[1:] for name in input_names), []).append(index)

    for members in groups.values():
        try:
            batch = {name: np.concatenate([feeds[i][name] for i in members]) for name in input_names}
            outputs = run(batch, [requests[i] for i in members])
            bounds = np.cumsum([feeds[i][input_names[0]].shape[0] for i in members])[:-1]
            parts = [np.split(np.asarray(output).astype(np.float32, copy=False), bounds) for output in outputs]
            for position, index in enumerate(members):
                tensors = [_tensor(name, part[position]) for name, part in zip(output_names, parts)]
                responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)
        except Exception as exc:  # noqa: BLE001 -- one bad group must not fail the other requests of the batch
            for index in members:
                responses[index] = pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"cross_encoder: {exc}"))
    return responses
