"""Triton's HTTP endpoint as the model server's watchers use it: health, metadata, repository
(load/unload), statistics and a tiny real inference. Supervision, the guard sidecar and the
embedded server's lifecycle all ask Triton through this one client.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from keyrank.modelserver.repository import GRAPH_INPUTS, INPUTS


class TritonAdmin:
    """Health, identity, repository control and a probe inference over Triton's HTTP endpoint.

    ``admin_header`` (name, value) unlocks the restricted APIs (model repository, config, ...).
    """

    def __init__(self, http_url: str, admin_header: tuple[str, str] | None = None, timeout_s: float = 1.0):
        self.http_url: str = http_url
        """Base URL, e.g. http://127.0.0.1:8000."""
        self.admin_header: tuple[str, str] | None = admin_header
        """Header that the server's ``--http-restricted-api`` option expects."""
        self.timeout_s: float = timeout_s
        """Timeout of the cheap calls (health, identity)."""

    def _call(self, method: str, path: str, body: dict | None = None, *, admin: bool = False,
              timeout: float | None = None) -> tuple[int, bytes]:
        """(status, body); status 0 when nothing answered (refused, reset, timed out)."""
        headers = {"Content-Type": "application/json"}
        if admin and self.admin_header:
            headers[self.admin_header[0]] = self.admin_header[1]
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.http_url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s if timeout is None else timeout) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except (urllib.error.URLError, OSError):
            return 0, b""

    def server_id(self) -> str | None:
        """The name the server reports (its ``--id``), None if it does not answer."""
        status, body = self._call("GET", "/v2")
        if status != 200:
            return None
        try:
            return str(json.loads(body).get("name"))
        except ValueError:
            return None

    def server_ready(self) -> bool:
        return self._call("GET", "/v2/health/ready")[0] == 200

    def model_ready(self, model: str) -> bool:
        return self._call("GET", f"/v2/models/{model}/ready")[0] == 200

    def repository_index(self) -> list[tuple[str, str]] | None:
        """(name, state) of every model in Triton's repository, loaded or not; None if the index cannot be read."""
        status, body = self._call("POST", "/v2/repository/index", {}, admin=True)
        if status != 200:
            return None
        try:
            return [(str(entry["name"]), str(entry.get("state", ""))) for entry in json.loads(body)]
        except (ValueError, KeyError, TypeError):
            return None

    def model_inputs(self, model: str) -> tuple[str, ...] | None:
        """The input names the model declares (its metadata); None if it does not answer."""
        status, body = self._call("GET", f"/v2/models/{model}")
        if status != 200:
            return None
        try:
            return tuple(str(tensor["name"]) for tensor in json.loads(body).get("inputs", []))
        except (ValueError, KeyError, TypeError):
            return None

    def unload(self, model: str) -> bool:
        """Returns at once: Triton marks the model unavailable and unloads it in the background."""
        return self._call("POST", f"/v2/repository/models/{model}/unload", {}, admin=True, timeout=10.0)[0] == 200

    def config(self, model: str) -> dict | None:
        """The model's configuration as Triton holds it (None if it does not answer)."""
        status, body = self._call("GET", f"/v2/models/{model}/config", admin=True)
        return json.loads(body) if status == 200 else None

    def load(self, model: str, timeout: float, config: dict | None = None) -> str | None:
        """Load (or reload) ``model``, with ``config`` instead of its config.pbtxt if given; None when ready."""
        request = {"parameters": {"config": json.dumps(config)}} if config else {}
        status, body = self._call("POST", f"/v2/repository/models/{model}/load", request, admin=True, timeout=timeout)
        if status == 200:
            return None
        return body.decode(errors="replace")[:300] or f"no answer within {timeout:.0f} s"

    def execution_count(self, model: str) -> int | None:
        """Executions the model has finished (Triton's statistics API); None if they cannot be read."""
        status, body = self._call("GET", f"/v2/models/{model}/stats", admin=True)
        if status != 200:
            return None
        try:
            return sum(int(stats.get("execution_count", 0)) for stats in json.loads(body)["model_stats"])
        except (ValueError, KeyError, TypeError):
            return None

    def probe_inference(self, model: str, timeout: float, *, graph: bool = False) -> str | None:
        """One tiny real inference ([1, 8] tokens; ``graph``: an interaction graph's, with its token roles). None if
        it scored; else "timeout" or Triton's error."""
        inputs = [{"name": name, "shape": [1, 8], "datatype": "INT64", "data": [1] * 8} for name in INPUTS]
        if graph:  # [CLS] q q [SEP] d d d [SEP]: the graph reads query and document tokens
            inputs.append({"name": GRAPH_INPUTS[-1], "shape": [1, 8], "datatype": "INT64", "data": [0, 1, 1, 0, 2, 2, 2, 0]})
        body = {"inputs": inputs, "outputs": [{"name": "logits"}]}
        t0 = time.monotonic()
        status, answer = self._call("POST", f"/v2/models/{model}/infer", body, timeout=timeout)
        if status == 200:
            return None
        if status == 0:
            return "timeout" if time.monotonic() - t0 >= timeout * 0.9 else "unreachable"
        return answer.decode(errors="replace")[:300]
