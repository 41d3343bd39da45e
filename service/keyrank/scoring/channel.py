"""The gateway's gRPC channel to Triton: every replica its target resolves to, balanced per call, a refused call
retried on another, and a replica that stops answering dropped within seconds (docs/RELIABILITY.md, "Several
Triton replicas")."""

from __future__ import annotations

import json
from typing import Any

TRITON_SERVICE = "inference.GRPCInferenceService"
"""Triton's gRPC service: what the retry policy applies to."""
RETRY_ATTEMPTS = 3
"""Tries of a call Triton refused with UNAVAILABLE (a replica going away, one not yet ready): with round_robin each
goes to the next replica. Inference is idempotent: a refused call is sent again whole."""
RETRY_BUFFER_BYTES = 64 * 2**20
"""gRPC keeps a call's request for a retry only up to this size (its default, 256 KiB, is less than a
[32, 512] batch's three int64 tensors: such calls were never retried)."""


def service_config(balancing: str) -> str:
    """gRPC service config: the load-balancing policy, and UNAVAILABLE retried (``RETRY_ATTEMPTS``) on any policy."""
    return json.dumps({
        "loadBalancingConfig": [{balancing: {}}],
        "methodConfig": [{
            "name": [{"service": TRITON_SERVICE}],
            "retryPolicy": {"maxAttempts": RETRY_ATTEMPTS, "initialBackoff": "0.02s", "maxBackoff": "0.2s",
                            "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]},
        }],
    })


def channel_args(connect_timeout_s: float, balancing: str = "round_robin", keepalive_s: float = 5.0,
                  keepalive_timeout_s: float = 5.0) -> list[tuple[str, Any]]:
    """One channel over every replica ``triton_url`` resolves to, balanced per call, with dead ones found fast.

    - 2 GiB messages, as tritonclient sets them.
    - ``balancing`` (``service_config``): round_robin keeps a connection to every address DNS gives and sends
      each call to the next ready one; gRPC resolves the name again whenever a connection closes (Triton's
      --grpc-max-connection-age closes them on purpose, so new replicas are found), at most once a second.
    - Keepalive every ``keepalive_s`` (0 = off), calls or none: an unanswered ping closes the connection after
      ``keepalive_timeout_s``, so a lost or black-holed replica stops getting calls within seconds instead of
      when TCP gives up (~15 min). tritonclient turns keepalive off, because Triton's default ping policy
      answers frequent pings with GOAWAY; the Triton we start, compose and the chart permit them.
    - Reconnect backoff 50 ms growing to 250 ms instead of gRPC's 1 s growing to 120 s: while Triton is down
      calls fail at once, and once it is back the channel reconnects within a quarter second. gRPC reads
      min_reconnect_backoff as the connect timeout, which bounds how long a call waits on a host that does
      not answer at all.
    """
    keepalive = [
        ("grpc.keepalive_time_ms", int(keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(keepalive_timeout_s * 1000)),
        # Any ping unanswered closes the connection: a keepalive ping is not sent while another ping (gRPC's
        # bandwidth probe) is in flight, and that one waited the default minute.
        ("grpc.http2.ping_timeout_ms", int(keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ] if keepalive_s > 0 else [("grpc.keepalive_time_ms", 2**31 - 1), ("grpc.keepalive_permit_without_calls", 0)]
    return [
        ("grpc.max_send_message_length", 2**31 - 1),
        ("grpc.max_receive_message_length", 2**31 - 1),
        *keepalive,
        ("grpc.service_config", service_config(balancing)),
        ("grpc.enable_retries", 1),
        ("grpc.per_rpc_retry_buffer_size", RETRY_BUFFER_BYTES),
        ("grpc.retry_buffer_size", 4 * RETRY_BUFFER_BYTES),
        ("grpc.dns_min_time_between_resolutions_ms", 1000),
        ("grpc.initial_reconnect_backoff_ms", 50),
        ("grpc.max_reconnect_backoff_ms", 250),
        ("grpc.min_reconnect_backoff_ms", max(50, int(connect_timeout_s * 1000))),
    ]
