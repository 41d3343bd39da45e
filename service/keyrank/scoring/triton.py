"""The service's scorer: the cross-encoder on Triton Inference Server, over async gRPC.

Triton's dynamic batcher only merges requests whose shapes match, so the
sequences are padded to length buckets and sent as whole ``[N, L]`` tensors,
many requests in flight over gRPC. A dead, unready or slow Triton becomes
``ScoringUnavailable`` inside the caller's deadline, never a hang.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import InferenceServerException

from keyrank import metrics
from keyrank.errors import ScoringUnavailable
from keyrank.scoring.buckets import LENGTH_BUCKETS, LENGTH_MULTIPLE
from keyrank.scoring.channel import channel_args
from keyrank.scoring.fairness import HIGH_PRIORITY, LOW_PRIORITY, FairGate, request_cost
from keyrank.scoring import (
    Batch,
    ModelInputs,
    Scores,
    bucket_batches,
    gather,
    relevance,
)


READY_TRIES = 3
"""Tries of a readiness check within its timeout (``TritonScorer.ready``)."""

_RECONNECT_GRACE_S = 0.3
"""How long a refused request waits for a reconnect before failing: a little over the longest
backoff, so the first request after Triton comes back succeeds and a dead Triton fails in 0.3 s."""

# A rejected request is our bug (wrong shape or dtype), not an outage: it must not hide as a 503.
_CALLER_BUGS = {"StatusCode.INVALID_ARGUMENT", "StatusCode.UNIMPLEMENTED"}



async def serves_as(client: Any, expected_id: str | None, timeout: float) -> bool:
    """Whether the Triton behind ``client`` (``tritonclient.grpc.aio``) reports ``expected_id`` as its
    name (its ``--id``); True when no id is expected (an external Triton)."""
    if not expected_id:
        return True
    return (await client.get_server_metadata(client_timeout=timeout)).name == expected_id


class _Unreachable(ScoringUnavailable):
    """Triton refused or dropped the connection (as opposed to a deadline or a model error)."""


def _retrieve(task: asyncio.Future) -> None:
    """Mark a batch's failure as seen: only the first one is raised, the rest are its echoes."""
    if not task.cancelled():
        task.exception()


class TritonScorer:
    """Async gRPC client of the cross-encoder; one per process, shared by all requests."""

    def __init__(
        self,
        url: str,
        *,
        model: str,
        pad_id: int,
        buckets: Sequence[int] = LENGTH_BUCKETS,
        batch_size: int = 32,
        max_in_flight: int = 8,
        probe_timeout_s: float = 1.0,
        server_id: str | None = None,
        max_shapes: int = 0,
        multiple: int = LENGTH_MULTIPLE,
        small_sequences: float = float("inf"),
        heavy_batch_size: int | None = None,
        heavy_in_flight: int | None = None,
        heavy_batch_s: float = 0.025,
        heavy_yield_s: float = 1.0,
        long_buckets: Sequence[int] = (),
        channel: dict[str, Any] | None = None,
    ) -> None:
        self.url: str = url
        """Triton's gRPC target: host:port (resolved by DNS: every address it gives is a replica) or any gRPC target."""
        self.channel: dict[str, Any] = channel or {}
        """``channel_args``' balancing, keepalive_s, keepalive_timeout_s (scoring/channel.py; unset: its defaults)."""
        self.model: str = model
        """Model name in the Triton repository."""
        self.pad_id: int = pad_id
        """Token id written after each sequence up to its bucket length."""
        self.buckets: tuple[int, ...] = tuple(sorted(buckets))
        """Padded lengths; a sequence goes to the smallest that fits."""
        self.batch_size: int = batch_size
        """Most sequences in one Triton request."""
        self.shapes: dict[str, int] = {"max_shapes": max_shapes, "multiple": multiple}
        """Per-request widths (scoring/buckets.py); max_shapes 0 = the fixed buckets."""
        self.long_buckets: tuple[int, ...] = tuple(long_buckets)
        """Widths past the buckets, up to the model's longest input (longp; scoring/buckets.py ``long_widths``)."""
        self.max_in_flight: int = max_in_flight
        """Most Triton requests in flight from this process, over all callers."""
        self.small_sequences: float = small_sequences
        """Requests estimated at most this costly are small (scoring/fairness.py); the rest are heavy."""
        self.heavy_batch_size: int | None = heavy_batch_size
        """Sequences in one Triton request of a heavy request; None = sized when its slot is granted: what the
        model server drains in ``heavy_batch_s``, one sequence while small requests are about."""
        self.heavy_in_flight: int = heavy_in_flight or max_in_flight
        """Most Triton requests of heavy requests in flight at once."""
        self.heavy_batch_s: float = heavy_batch_s
        """How long one batch of a heavy request may keep the model server (sized batches)."""
        self.heavy_yield_s: float = heavy_yield_s
        """After a small request's batch, heavy requests send one sequence per batch for this long."""
        self.probe_timeout_s: float = probe_timeout_s
        """Connect timeout of the channel and default timeout of ``ready``."""
        self.server_id: str | None = server_id
        """The ``--id`` the server must report (our embedded Triton, not another process on its port); None = any."""
        # gRPC aio channels and gates belong to the loop that made them: made on first use, remade if the loop changes
        self.reads_roles: bool = False
        """The model is an interaction graph (``with_graph``): each request carries ``token_roles`` too."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: triton_aio.InferenceServerClient | None = None
        self._in_flight: FairGate | None = None

    def with_graph(self, onnx_path: str | Path, model: str | None = None) -> TritonScorer:
        """The same server, buckets and batching on an interaction graph's model (``model``, by default the graph's
        own name, ``<kind>-features``, as installing it writes it into the repositories), with its own connection
        and slots."""
        graph = copy.copy(self)
        graph.model, graph.reads_roles = model or Path(onnx_path).stem, True
        graph._loop = graph._client = graph._in_flight = None
        return graph

    def _connection(self) -> tuple[triton_aio.InferenceServerClient, FairGate]:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = triton_aio.InferenceServerClient(
                self.url, channel_args=channel_args(self.probe_timeout_s, **self.channel)
            )
            # Sized heavy batches also yield slots: one heavy batch in flight while small requests are about.
            yield_s = self.heavy_yield_s if self.heavy_batch_size is None else 0.0
            self._in_flight = FairGate(self.max_in_flight, self.heavy_in_flight, yield_s)
            self._loop = loop
        assert self._in_flight is not None
        return self._client, self._in_flight

    async def score(self, inputs: ModelInputs, *, want_pooled: bool, deadline: float) -> Scores:
        """Logits [n] (and pooled vectors [n, H] if asked) of sequences framed by the model's template.

        ``deadline`` is a ``time.monotonic()`` instant; past it, or with Triton down, raises
        ``ScoringUnavailable`` and cancels whatever is still in flight. The request's cost
        (``fairness.request_cost``) decides its batches' size, order and priority (scoring/fairness.py).
        """
        n = len(inputs)
        cost = request_cost.get()
        heavy = cost > self.small_sequences
        # A heavy request's batches are sized when their slots are granted: cut here into one-sequence pieces.
        sized = heavy and self.heavy_batch_size is None
        size = 1 if sized else self.heavy_batch_size if heavy else self.batch_size
        batches = bucket_batches(inputs, buckets=self.buckets, batch_size=size, pad_id=self.pad_id,
                                 long_buckets=self.long_buckets, **self.shapes)
        if n == 0:
            return gather(0, [], [], want_pooled)
        if deadline - time.monotonic() <= 0:
            metrics.TRITON_ERRORS.labels(kind="deadline").inc()
            raise ScoringUnavailable("request deadline passed before scoring")
        try:
            sent, results = await self._send(batches, sized, want_pooled, deadline, cost, heavy)
        except _Unreachable:
            # The channel may still hold the refusal from before Triton came back (reconnect
            # backoff): if Triton answers within a short grace, the request is sent once more.
            if not await self._reconnected(deadline):
                raise
            sent, results = await self._send(batches, sized, want_pooled, deadline, cost, heavy)
        return gather(n, sent, results, want_pooled)

    async def _send(
        self, batches: list[Batch], sized: bool, want_pooled: bool, deadline: float, cost: float, heavy: bool
    ) -> tuple[list[Batch], list[tuple[np.ndarray, np.ndarray | None]]]:
        """All batches concurrently (bounded by the process-wide slots, cheapest request first); the first
        failure cancels the rest. ``sized``: ``batches`` are one-sequence pieces that up to ``heavy_in_flight``
        senders join into batches as their slots are granted. Returns the batches sent and their answers."""
        client, gate = self._connection()
        if sized:
            pieces = deque(batches)
            jobs = [self._sized(client, gate, pieces, want_pooled, deadline, cost) for _ in range(min(self.heavy_in_flight, len(pieces)))]
        else:
            jobs = [self._one(client, gate, b, want_pooled, deadline, cost, heavy) for b in batches]
        tasks = [asyncio.ensure_future(job) for job in jobs]
        for task in tasks:
            task.add_done_callback(_retrieve)
        try:
            done, pending = await asyncio.wait(
                tasks, timeout=max(0.0, deadline - time.monotonic()), return_when=asyncio.FIRST_EXCEPTION
            )
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            if pending:
                metrics.TRITON_ERRORS.labels(kind="deadline").inc()
                raise ScoringUnavailable("request deadline passed while scoring on Triton")
        finally:
            for task in tasks:
                task.cancel()
        answered = [pair for task in tasks for pair in task.result()]
        return [batch for batch, _ in answered], [result for _, result in answered]

    async def _one(self, client, gate: FairGate, batch: Batch, want_pooled: bool, deadline: float, cost: float,
                   heavy: bool) -> list[tuple[Batch, tuple[np.ndarray, np.ndarray | None]]]:
        async with gate.slot(cost, heavy):
            return [(batch, await self._infer(client, gate, batch, want_pooled, deadline, heavy))]

    async def _sized(self, client, gate: FairGate, pieces: deque[Batch], want_pooled: bool, deadline: float,
                     cost: float) -> list[tuple[Batch, tuple[np.ndarray, np.ndarray | None]]]:
        """Send a heavy request's pieces until none is left, each batch sized when the slot is granted: one
        sequence while small requests are about, else what the model server drains in ``heavy_batch_s``."""
        answered = []
        while pieces:
            await gate.heavy_turn()
            async with gate.slot(cost, True):
                if not pieces:
                    break
                width = pieces[0].width
                rows = 1 if gate.yielding() else gate.pace.rows(self.heavy_batch_s, width, self.batch_size)
                group = [pieces.popleft()]
                while pieces and len(group) < rows and pieces[0].width == width:
                    group.append(pieces.popleft())
                batch = Batch.join(group)
                call = asyncio.ensure_future(self._infer(client, gate, batch, want_pooled, deadline, True))
                with gate.heavy_batch(call, len(group), gate.pace.seconds(batch.rows.size * batch.width)):
                    try:
                        answered.append((batch, await call))
                    except asyncio.CancelledError:
                        if not gate.preempted(call) or asyncio.current_task().cancelling():
                            raise
                        pieces.extendleft(reversed(group))  # sent again when the small request's batch is done
        return answered

    async def _reconnected(self, deadline: float) -> bool:
        """Whether Triton's server answers within the reconnect grace (and before ``deadline``)."""
        client, _ = self._connection()
        until = min(deadline, time.monotonic() + _RECONNECT_GRACE_S)
        while (remaining := until - time.monotonic()) > 0:
            try:
                if await client.is_server_live(client_timeout=remaining):
                    return True
            except InferenceServerException:
                pass
            await asyncio.sleep(min(0.02, max(0.0, until - time.monotonic())))
        return False

    async def _infer(
        self,
        client: triton_aio.InferenceServerClient,
        gate: FairGate,
        batch: Batch,
        want_pooled: bool,
        deadline: float,
        heavy: bool,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """One Triton request, inside a slot of ``gate`` the caller holds."""
        inputs = []
        for name, array in batch.feeds(roles=self.reads_roles).items():
            tensor = InferInput(name, list(array.shape), "INT64")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        outputs = [InferRequestedOutput("logits")] + ([InferRequestedOutput("pooled")] if want_pooled else [])
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            metrics.TRITON_ERRORS.labels(kind="deadline").inc()
            raise ScoringUnavailable("request deadline passed while waiting for a Triton slot")
        t0 = time.perf_counter()
        try:
            result = await client.infer(self.model, inputs, outputs=outputs, client_timeout=remaining,
                                        priority=LOW_PRIORITY if heavy else HIGH_PRIORITY)
        except InferenceServerException as exc:
            kind = (exc.status() or "unknown").removeprefix("StatusCode.").lower()
            metrics.TRITON_ERRORS.labels(kind=kind).inc()
            if exc.status() in _CALLER_BUGS:
                raise RuntimeError(f"Triton rejected the request: {exc.message()}") from exc
            if exc.status() == "StatusCode.DEADLINE_EXCEEDED":
                raise ScoringUnavailable("request deadline passed while Triton was scoring") from exc
            if exc.status() == "StatusCode.UNAVAILABLE":
                raise _Unreachable(f"Triton unavailable: {exc.message()}") from exc
            raise ScoringUnavailable(f"Triton: {exc.message()}") from exc
        except (grpc.RpcError, OSError) as exc:
            metrics.TRITON_ERRORS.labels(kind="connection").inc()
            raise _Unreachable(f"Triton unreachable: {exc}") from exc
        metrics.TRITON_RTT.labels(bucket=batch.bucket).observe(time.perf_counter() - t0)
        gate.pace.done(batch.rows.size * batch.width)
        metrics.TRITON_BATCH_SIZE.labels(bucket=batch.bucket).observe(batch.rows.size)
        logits = relevance(result.as_numpy("logits"), batch.rows.size)
        return logits, (result.as_numpy("pooled") if want_pooled else None)

    async def ready(self, timeout: float | None = None) -> bool:
        """Model ready (so the server is live) and the server the one expected (``server_id``), answered within
        ``timeout`` seconds (False otherwise).

        Asked up to ``READY_TRIES`` times within ``timeout``, each try in its share of it: with round_robin each
        goes to the next replica, so one replica that stops answering (until keepalive drops it) does not turn
        readiness false while the others serve."""
        timeout = self.probe_timeout_s if timeout is None else timeout
        client, _ = self._connection()
        until = time.monotonic() + timeout
        for tries_left in range(READY_TRIES, 0, -1):
            share = (until - time.monotonic()) / tries_left
            if share <= 0:
                return False
            try:
                async with asyncio.timeout(share):
                    # one call a try where no server id is expected (the replicas' case): a second call of the
                    # same try would go to the next replica, the silent one among them
                    if (await client.is_model_ready(self.model, client_timeout=share)
                            and await serves_as(client, self.server_id, share)):
                        return True
            except (InferenceServerException, grpc.RpcError, OSError, TimeoutError):
                pass
        return False

    async def model_metadata(self) -> dict:
        """Triton's metadata of the model (inputs, outputs, versions) as JSON."""
        client, _ = self._connection()
        try:
            return await client.get_model_metadata(self.model, as_json=True, client_timeout=self.probe_timeout_s)
        except InferenceServerException as exc:
            raise ScoringUnavailable(f"Triton: {exc.message()}") from exc

    async def close(self) -> None:
        """Close the channel (call from the loop that used it)."""
        client, self._client, self._loop, self._in_flight = self._client, None, None, None
        if client is not None:
            await client.close()
