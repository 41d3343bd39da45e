"""Stage: score assembled sequences with the cross-encoder on Triton.

Triton's dynamic batcher only merges requests whose shapes match, so the
sequences are padded to length buckets and sent as whole ``[N, L]`` tensors,
many requests in flight over gRPC. A dead, unready or slow Triton becomes
``ScoringUnavailable`` inside the caller's deadline, never a hang.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import InferenceServerException

from keyrank import metrics
from keyrank.config import Settings, get_settings
from keyrank.errors import ScoringUnavailable


def _channel_args(connect_timeout_s: float) -> list[tuple[str, Any]]:
    """tritonclient's own defaults plus a short reconnect backoff.

    2 GiB messages and keepalive effectively off (so Triton's ping policy never answers GOAWAY),
    as tritonclient sets them. Backoff 50 ms growing to 250 ms instead of gRPC's 1 s growing to
    120 s: while Triton is down calls fail at once, and once it is back the channel reconnects
    within a quarter second. gRPC reads min_reconnect_backoff as the connect timeout, which bounds
    how long a call waits on a host that does not answer at all.
    """
    return [
        ("grpc.max_send_message_length", 2**31 - 1),
        ("grpc.max_receive_message_length", 2**31 - 1),
        ("grpc.keepalive_time_ms", 2**31 - 1),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", 250),
        ("grpc.min_reconnect_backoff_ms", max(50, int(connect_timeout_s * 1000))),
    ]


_RECONNECT_GRACE_S = 0.3
"""How long a refused request waits for a reconnect before failing: a little over the longest
backoff, so the first request after Triton comes back succeeds and a dead Triton fails in 0.3 s."""

# A rejected request is our bug (wrong shape or dtype), not an outage: it must not hide as a 503.
_CALLER_BUGS = {"StatusCode.INVALID_ARGUMENT", "StatusCode.UNIMPLEMENTED"}


class _Unreachable(ScoringUnavailable):
    """Triton refused or dropped the connection (as opposed to a deadline or a model error)."""


@dataclass(frozen=True, slots=True)
class _Batch:
    """One Triton request: rows of the caller's input, padded to one bucket length."""

    rows: np.ndarray
    """int64 [N] positions of these sequences in the caller's list."""
    input_ids: np.ndarray
    """int64 [N, L] token ids, pad id after each sequence."""
    token_type_ids: np.ndarray
    """int64 [N, L] segment ids, 0 on padding."""
    attention_mask: np.ndarray
    """int64 [N, L] 1 on the sequence, 0 on padding."""

    @property
    def bucket(self) -> str:
        """The padded length, as the metrics label."""
        return str(self.input_ids.shape[1])


def bucket_batches(
    input_ids: Sequence[np.ndarray],
    token_type_ids: Sequence[np.ndarray],
    *,
    buckets: Sequence[int],
    batch_size: int,
    pad_id: int,
) -> list[_Batch]:
    """Group sequences by the smallest bucket that fits and cut each group into balanced batches."""
    if len(input_ids) != len(token_type_ids):
        raise ValueError(f"{len(input_ids)} input_ids but {len(token_type_ids)} token_type_ids")
    edges = np.asarray(sorted(buckets), dtype=np.int64)
    lengths = np.fromiter((len(ids) for ids in input_ids), dtype=np.int64, count=len(input_ids))
    if lengths.size and (lengths.max() > edges[-1] or lengths.min() == 0):
        raise ValueError(f"sequence lengths must be in 1..{edges[-1]}, got {lengths.min()}..{lengths.max()}")
    which = np.searchsorted(edges, lengths, side="left")
    batches: list[_Batch] = []
    for b in np.unique(which):
        members = np.flatnonzero(which == b)
        width = int(edges[b])
        # Balanced chunks (e.g. 17 + 16, not 32 + 1) so concurrent requests finish together.
        for rows in np.array_split(members, -(-members.size // batch_size)):
            ids = np.full((rows.size, width), pad_id, dtype=np.int64)
            types = np.zeros((rows.size, width), dtype=np.int64)
            mask = np.zeros((rows.size, width), dtype=np.int64)
            for r, row in enumerate(rows):
                n = lengths[row]
                ids[r, :n] = input_ids[row]
                types[r, :n] = token_type_ids[row]
                mask[r, :n] = 1
            batches.append(_Batch(rows, ids, types, mask))
    return batches


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
        pad_id: int,
        settings: Settings | None = None,
        model: str | None = None,
    ) -> None:
        settings = settings or get_settings()
        self.url: str = url
        """host:port of Triton's gRPC endpoint."""
        self.model: str = model or settings.triton_model
        """Model name in the Triton repository."""
        self.pad_id: int = pad_id
        """Token id written after each sequence up to its bucket length."""
        self.buckets: tuple[int, ...] = tuple(sorted(settings.length_buckets))
        """Padded lengths; a sequence goes to the smallest that fits."""
        self.batch_size: int = settings.triton_batch_size
        """Most sequences in one Triton request."""
        self.max_in_flight: int = settings.triton_max_in_flight
        """Most Triton requests in flight from this process, over all callers."""
        self.probe_timeout_s: float = settings.triton_connect_timeout_s
        """Default timeout of ``ready``."""
        # gRPC aio channels and asyncio semaphores belong to the loop that made them: both are made
        # lazily on first use inside the running loop (the FastAPI app's), and remade if the loop changes.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: triton_aio.InferenceServerClient | None = None
        self._in_flight: asyncio.Semaphore | None = None

    def _connection(self) -> tuple[triton_aio.InferenceServerClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = triton_aio.InferenceServerClient(
                self.url, channel_args=_channel_args(self.probe_timeout_s)
            )
            self._in_flight = asyncio.Semaphore(self.max_in_flight)
            self._loop = loop
        assert self._in_flight is not None
        return self._client, self._in_flight

    async def score(
        self,
        input_ids: Sequence[np.ndarray],
        token_type_ids: Sequence[np.ndarray],
        *,
        want_pooled: bool,
        deadline: float,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Logits [n] (and pooled vectors [n, H] if asked) for full ``[CLS] q [SEP] p [SEP]`` sequences.

        ``deadline`` is a ``time.monotonic()`` instant; past it, or with Triton down, raises
        ``ScoringUnavailable`` and cancels whatever is still in flight.
        """
        n = len(input_ids)
        batches = bucket_batches(
            input_ids, token_type_ids, buckets=self.buckets, batch_size=self.batch_size, pad_id=self.pad_id
        )
        if n == 0:
            return np.zeros(0, dtype=np.float32), (np.zeros((0, 0), dtype=np.float32) if want_pooled else None)
        if deadline - time.monotonic() <= 0:
            metrics.TRITON_ERRORS.labels(kind="deadline").inc()
            raise ScoringUnavailable("request deadline passed before scoring")
        try:
            results = await self._send(batches, want_pooled, deadline)
        except _Unreachable:
            # The channel may still hold the refusal from before Triton came back (reconnect
            # backoff): if Triton answers within a short grace, the request is sent once more.
            if not await self._reconnected(deadline):
                raise
            results = await self._send(batches, want_pooled, deadline)
        logits = np.empty(n, dtype=np.float32)
        pooled: np.ndarray | None = None
        for batch, (batch_logits, batch_pooled) in zip(batches, results):
            logits[batch.rows] = batch_logits
            if want_pooled:
                if pooled is None:
                    pooled = np.empty((n, batch_pooled.shape[1]), dtype=np.float32)
                pooled[batch.rows] = batch_pooled
        return logits, pooled

    async def _send(
        self, batches: list[_Batch], want_pooled: bool, deadline: float
    ) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """All batches concurrently (bounded by the process-wide slots); the first failure cancels the rest."""
        client, in_flight = self._connection()
        tasks = [asyncio.ensure_future(self._infer(client, in_flight, b, want_pooled, deadline)) for b in batches]
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
        return [task.result() for task in tasks]

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
        in_flight: asyncio.Semaphore,
        batch: _Batch,
        want_pooled: bool,
        deadline: float,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        inputs = []
        for name, array in (
            ("input_ids", batch.input_ids),
            ("attention_mask", batch.attention_mask),
            ("token_type_ids", batch.token_type_ids),
        ):
            tensor = InferInput(name, list(array.shape), "INT64")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        outputs = [InferRequestedOutput("logits")] + ([InferRequestedOutput("pooled")] if want_pooled else [])
        async with in_flight:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                metrics.TRITON_ERRORS.labels(kind="deadline").inc()
                raise ScoringUnavailable("request deadline passed while waiting for a Triton slot")
            t0 = time.perf_counter()
            try:
                result = await client.infer(self.model, inputs, outputs=outputs, client_timeout=remaining)
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
        metrics.TRITON_BATCH_SIZE.labels(bucket=batch.bucket).observe(batch.rows.size)
        # Single-label rerankers: logits is [N, 1], the relevance score is its only column.
        logits = result.as_numpy("logits").reshape(batch.rows.size, -1)[:, 0]
        return logits, (result.as_numpy("pooled") if want_pooled else None)

    async def ready(self, timeout: float | None = None) -> bool:
        """Server live and model ready, answered within ``timeout`` seconds (False otherwise)."""
        timeout = self.probe_timeout_s if timeout is None else timeout
        client, _ = self._connection()
        try:
            async with asyncio.timeout(timeout):
                return bool(
                    await client.is_server_live(client_timeout=timeout)
                    and await client.is_model_ready(self.model, client_timeout=timeout)
                )
        except (InferenceServerException, grpc.RpcError, OSError, TimeoutError):
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
