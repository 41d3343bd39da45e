"""The containers, for real: every image builds and the whole stack runs under Docker without a GPU.

Builds the base image (docker/base/make-debian-base.sh, from Debian's packages: no registry is needed),
the gateway, models-init and CPU Triton images, then runs docker-compose.yml + docker-compose.cpu.yml
under a private compose project and checks, from the host on a port published on 127.0.0.1 only:
the three rerank APIs against ``Reranker.local`` on the very files the stack serves, non-root
read-only containers with healthy healthchecks, a Triton crash (503 + Retry-After, no hang, then 200
again without restarting the gateway), the images' hygiene, labels and tags, the chart's defaults
against the images, and that ``compose down -v`` leaves nothing behind.

Needs a Docker Engine: a running one, or (as root) ``dockerd`` from Debian's docker.io, which this
module starts and stops itself. When none can run, every test here is skipped with the reason.

Build inputs, for air-gapped machines (the defaults fit this repository's CI):
  KEYRANK_DOCKER_BASE       base image for all three images (default: keyrank-base:bookworm, made
                            by docker/base/make-debian-base.sh with this machine's CA bundle)
  KEYRANK_DOCKER_CA_BUNDLE  CA bundle baked into that locally made base (default: the system bundle)
  KEYRANK_DOCKER_WHEELS     folder with a CPU torch wheel served to the models-init build (default:
                            pip's find-links when it holds one, else PyTorch's CPU index)
Timings and sizes go to runs/docker/report.json and the terminal.
"""

from __future__ import annotations

import glob
import http.server
import json
import math
import os
import re
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared_data import CE_MODEL, REPO

pytestmark = [pytest.mark.docker, pytest.mark.timeout(2400)]

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
BASE_IMAGE = os.environ.get("KEYRANK_DOCKER_BASE", "keyrank-base:bookworm")
CA_BUNDLE = os.environ.get("KEYRANK_DOCKER_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
IMAGES = {  # name -> (Dockerfile, context)
    "keyrank-triton-cpu": ("docker/triton-cpu/Dockerfile", "docker/triton-cpu"),
    "keyrank-gateway": ("Dockerfile", "."),
    "keyrank-prepare": ("docker/prepare/Dockerfile", "."),
}
UNUSED = {"httptools", "hf-xet"}  # the gateway Dockerfile's UNUSED: dependencies it removes
COMPOSE_FILES = ["docker-compose.yml", "docker-compose.cpu.yml"]
WHEEL_PORT = 38571  # fixed, so the build argument (part of the layer cache key) is the same every run
REPORT = REPO / "runs" / "docker" / "report.json"
QUERY = "what may the remote control cost"
DOCS = [
    "Whisk the eggs with the sugar, fold in the flour and bake for twenty minutes.",
    "Project manager: let us start with the budget. Marketing: we agreed that the remote control must not cost "
    "more than 12.50 euros to produce. Industrial designer: then the case is plastic, and the battery a simple pair "
    "of AA cells. " * 20,
    "The train leaves at nine; the remote village has no station, so a bus takes the last twelve kilometres.",
]

report: dict = {"version": VERSION, "base_image": BASE_IMAGE, "builds_s": {}, "sizes_mb": {}}


def say(config, line: str) -> None:
    """A line on the terminal even under output capture (the build takes minutes)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"[docker] {line}")


def run(*command: str, timeout: float = 600, check: bool = True, env: dict | None = None,
        input: str | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env, input=input)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# --- the engine ----------------------------------------------------------------------------


def docker_answers() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0


@pytest.fixture(scope="module")
def docker(request) -> Iterator[str]:
    """The docker CLI, with an engine that answers: the running one, or a dockerd started here."""
    if shutil.which("docker") is None:
        pytest.skip("no docker CLI (Debian package docker.io; .ci/run installs it)")
    started = None
    if not docker_answers():
        if shutil.which("dockerd") is None or os.geteuid() != 0:
            pytest.skip("no Docker Engine answers and dockerd cannot be started here (needs root and docker.io)")
        log_path = REPO / "runs" / "docker" / "dockerd.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")
        started = subprocess.Popen(["dockerd", "--storage-driver=overlay2"], stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        deadline = time.monotonic() + 60
        while not docker_answers():
            if started.poll() is not None or time.monotonic() > deadline:
                started.kill() if started.poll() is None else None
                tail = log_path.read_text(errors="replace")[-2000:]
                pytest.skip(f"dockerd could not start (exit {started.poll()}); its log ends:\n{tail}")
            time.sleep(0.5)
        say(request.config, f"started dockerd (pid {started.pid}); stopped after these tests")
    try:
        yield "docker"
    finally:
        if started is not None:
            started.send_signal(signal.SIGTERM)
            try:
                started.wait(60)
            except subprocess.TimeoutExpired:
                started.kill()
                started.wait(10)


@pytest.fixture(scope="module")
def compose(docker) -> list[str]:
    """`docker compose` (v2 plugin) when present, else Debian's docker-compose (v1)."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.skip("neither `docker compose` nor docker-compose is installed (Debian package docker-compose)")


# --- images --------------------------------------------------------------------------------


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def torch_wheel_dir() -> Path | None:
    """A folder holding a CPU torch wheel for the base image's Python (cp311), or None."""
    candidates = [os.environ.get("KEYRANK_DOCKER_WHEELS", "")]
    candidates += os.environ.get("PIP_FIND_LINKS", "").split()
    pip = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    candidates += [v for line in pip.stdout.splitlines() if "find-links" in line
                   for v in line.split("=", 1)[1].strip("'\" ").split()]
    for folder in filter(None, candidates):
        if glob.glob(os.path.join(folder, "torch-*+cpu-cp311-*.whl")):
            return Path(folder)
    return None


@pytest.fixture(scope="module")
def wheel_server() -> Iterator[dict[str, str]]:
    """Build arguments for the models-init image's PyTorch: a local wheel folder served on loopback
    (the build runs with --network host) when there is one, else the Dockerfile's default index."""
    folder = torch_wheel_dir()
    if folder is None:
        yield {}
        return
    wheel = sorted(glob.glob(str(folder / "torch-*+cpu-cp311-*.whl")))[-1]
    version = Path(wheel).name.split("-")[1]
    port = WHEEL_PORT if port_free(WHEEL_PORT) else free_port()
    handler = lambda *a, **k: _QuietHandler(*a, directory=str(folder), **k)  # noqa: E731
    server = socketserver.ThreadingTCPServer(("127.0.0.1", port), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield {"TORCH_SPEC": f"torch=={version}", "TORCH_PIP_ARGS": f"--find-links http://127.0.0.1:{port}/"}
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def images(request, docker, wheel_server) -> dict[str, str]:
    """Every image built (layer cache: a second run takes seconds); name -> tag."""
    config = request.config
    if BASE_IMAGE == "keyrank-base:bookworm":
        start = time.monotonic()
        command = [str(REPO / "docker" / "base" / "make-debian-base.sh")]
        if os.path.exists(CA_BUNDLE):
            command += ["--ca-bundle", CA_BUNDLE]
        result = run(*command, BASE_IMAGE, timeout=900, check=False)
        if result.returncode != 0:
            pytest.fail(f"could not make the base image:\n{result.stdout}\n{result.stderr}")
        report["builds_s"]["base"] = round(time.monotonic() - start, 1)
        say(config, f"base {BASE_IMAGE}: {result.stdout.strip().splitlines()[-1]} ({report['builds_s']['base']} s)")
    tags = {}
    for name, (dockerfile, context) in IMAGES.items():
        tag = f"{name}:{VERSION}"
        args = {"PYTHON_IMAGE": BASE_IMAGE, "VERSION": VERSION}
        if name == "keyrank-prepare":
            args |= wheel_server
        command = ["docker", "build", "--network", "host", "-f", dockerfile, "-t", tag]
        for key, value in args.items():
            command += ["--build-arg", f"{key}={value}"]
        start = time.monotonic()
        result = run(*command, context, timeout=1500, check=False)
        elapsed = round(time.monotonic() - start, 1)
        if result.returncode != 0:
            pytest.fail(f"docker build of {tag} failed after {elapsed} s:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}")
        size = int(run("docker", "image", "inspect", "-f", "{{.Size}}", tag).stdout)
        report["builds_s"][name] = elapsed
        report["sizes_mb"][name] = round(size / 1e6)
        say(config, f"built {tag} in {elapsed} s: {size / 1e6:.0f} MB")
        tags[name] = tag
    write_report()
    return tags


def write_report() -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=2) + "\n")


def inspect(ref: str, kind: str = "image") -> dict:
    return json.loads(run("docker", kind, "inspect", ref).stdout)[0]


# --- the stack -----------------------------------------------------------------------------


class Stack:
    def __init__(self, compose: list[str], project: str, env: dict[str, str], port: int):
        self.compose, self.project, self.env, self.port = compose, project, env, port
        self.url = f"http://127.0.0.1:{port}"

    def __call__(self, *args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
        files = [a for f in COMPOSE_FILES for a in ("-f", f)]
        return run(*self.compose, "-p", self.project, *files, *args, timeout=timeout, check=check, env=self.env)

    def container(self, service: str) -> str:
        ids = run("docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={self.project}",
                  "--filter", f"label=com.docker.compose.service={service}").stdout.split()
        assert len(ids) == 1, f"{service}: {ids}"
        return ids[0]

    def leftovers(self) -> dict[str, list[str]]:
        label = f"label=com.docker.compose.project={self.project}"
        return {
            "containers": run("docker", "ps", "-aq", "--filter", label).stdout.split(),
            "networks": run("docker", "network", "ls", "-q", "--filter", label).stdout.split(),
            "volumes": run("docker", "volume", "ls", "-q", "--filter", label).stdout.split(),
        }

    def down(self) -> subprocess.CompletedProcess:
        return self("down", "-v", "--remove-orphans", "--timeout", "10", timeout=180, check=False)


def wait_for(what: str, predicate, timeout: float, interval: float = 1.0):
    """Poll ``predicate`` until it returns a truthy value; bounded."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - connection refused etc. while starting
            last = exc
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


def get(url: str, timeout: float = 5.0):
    import httpx

    return httpx.get(url, timeout=timeout)


@pytest.fixture(scope="module")
def stack(request, compose, images) -> Iterator[Stack]:
    """docker-compose.yml + docker-compose.cpu.yml up (models -> triton -> gateway), torn down always."""
    if not (CE_MODEL / "config.json").exists():
        pytest.skip(f"no local cross-encoder checkpoint at {CE_MODEL} (no model hub is reachable)")
    port = free_port()
    project = f"keyrankci{os.getpid()}"
    env = dict(os.environ, KEYRANK_VERSION=VERSION, KEYRANK_PUBLISH_PORT=str(port), KEYRANK_PUBLISH_ADDRESS="127.0.0.1",
               KEYRANK_CHECKPOINT=str(CE_MODEL), KEYRANK_PYTHON_IMAGE=BASE_IMAGE, COMPOSE_PROJECT_NAME=project)
    stack = Stack(compose, project, env, port)
    start = time.monotonic()
    try:
        # Prometheus and Grafana come from public registries: only the keyrank services here.
        result = stack("up", "-d", "--no-build", "gateway", timeout=900, check=False)
        if result.returncode != 0:
            logs = stack("logs", "--no-color", "--tail", "60", check=False)
            pytest.fail(f"compose up failed:\n{result.stderr[-4000:]}\n{logs.stdout[-6000:]}")
        wait_for("gateway /readyz 200", lambda: get(f"{stack.url}/readyz").status_code == 200, timeout=300)
        report["compose_up_to_ready_s"] = round(time.monotonic() - start, 1)
        say(request.config, f"stack ready in {report['compose_up_to_ready_s']} s on {stack.url}")
        yield stack
    finally:
        if request.session.testsfailed:
            logs = stack("logs", "--no-color", "--tail", "40", check=False)
            say(request.config, "compose logs (a test failed):\n" + logs.stdout[-6000:])
        stack.down()
        write_report()


@pytest.fixture(scope="module")
def served_models(stack, tmp_path_factory) -> Path:
    """The model files the stack serves, copied out of the models-init container's volume."""
    target = tmp_path_factory.mktemp("served-models")
    run("docker", "cp", f"{stack.container('models')}:/models/.", str(target))
    assert (target / "triton" / "cross_encoder" / "1" / "model.onnx").exists()
    return target


# --- the tests -----------------------------------------------------------------------------


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def post(stack: Stack, path: str, body: dict, timeout: float = 60.0):
    import httpx

    return httpx.post(f"{stack.url}{path}", json=body, timeout=timeout)


@pytest.mark.parametrize("strategy,selector", [("keyb2-blocks", "bm25"), ("keyb2", "bm25"), ("keyb2", "dense"), ("maxp", None),
                                               ("firstp", None)])
def test_the_three_rerank_apis_match_the_local_reranker(stack, served_models, strategy, selector):
    from keyrank import Reranker
    from keyrank.config import Settings

    default = tuple(Settings.model_fields[f"default_{what}"].default for what in ("strategy", "selector"))  # the image sets neither
    local = Reranker.local(served_models)
    try:
        expected = {r.index: r.score for r in local.rank(QUERY, DOCS, strategy=strategy, selector=selector).results}
    finally:
        local.close()
    options = {"strategy": strategy} | ({"selector": selector} if selector else {})
    cases = [("/rerank", {"query": QUERY, "documents": DOCS, **options}, lambda x: x)]
    if (strategy, selector) == default:  # the gateway's default: what Jina's and Cohere's shapes use
        # They answer the sigmoid of keyrank's score, as their clients expect.
        cases += [("/v1/rerank", {"query": QUERY, "documents": DOCS, "model": "keyrank"}, sigmoid),
                  ("/v2/rerank", {"query": QUERY, "documents": DOCS, "model": "keyrank"}, sigmoid)]
    for path, body, scale in cases:
        response = post(stack, path, body)
        assert response.status_code == 200, (path, response.text)
        results = response.json()["results"]
        assert {r["index"] for r in results} == set(expected), path
        for r in results:
            assert abs(r["relevance_score"] - scale(expected[r["index"]])) <= 1e-4, (path, r, expected)
    assert max(expected, key=expected.get) == 1


def test_gateway_and_triton_run_non_root_on_a_read_only_root_with_healthy_healthchecks(stack):
    for service in ("gateway", "triton"):
        container = stack.container(service)
        info = inspect(container, "container")
        assert info["HostConfig"]["ReadonlyRootfs"] is True, service
        assert info["Config"]["User"].split(":")[0] not in {"", "root", "0"}, service
        assert info["HostConfig"]["CapDrop"] == ["ALL"] or "ALL" in info["HostConfig"]["CapDrop"], service
        uids = {line.split()[1] for line in run("docker", "top", container, "-eo", "pid,uid,comm").stdout.splitlines()[1:]}
        assert uids and "0" not in uids, (service, uids)
        write = run("docker", "exec", container, "sh", "-c", "touch /probe-root-fs", check=False)
        assert write.returncode != 0 and "Read-only file system" in write.stderr, (service, write.stderr)
        wait_for(f"{service} healthcheck healthy",
                 lambda: inspect(container, "container")["State"]["Health"]["Status"] == "healthy", timeout=90)


def test_a_triton_crash_gives_503_with_retry_after_then_recovers_without_restarting_the_gateway(stack):
    """SIGKILL of the Triton container's process from the host: a crash, which compose's restart policy
    repairs. (`docker kill` itself marks the container as stopped by hand, and Docker's restart policy
    ignores manual stops, so it would not come back by design.)"""
    triton, gateway = stack.container("triton"), stack.container("gateway")
    gateway_started = inspect(gateway, "container")["State"]["StartedAt"]
    restarts = inspect(triton, "container")["RestartCount"]
    os.kill(inspect(triton, "container")["State"]["Pid"], signal.SIGKILL)

    wait_for("/readyz 503", lambda: get(f"{stack.url}/readyz").status_code == 503, timeout=30, interval=0.2)
    start = time.monotonic()
    response = post(stack, "/rerank", {"query": QUERY, "documents": DOCS}, timeout=40)
    elapsed = time.monotonic() - start
    if response.status_code == 503:  # Triton may already be back: then 200 is right too
        assert int(response.headers["Retry-After"]) >= 1
        assert elapsed < 35, f"503 after {elapsed:.1f} s: bounded by the request deadline, not a hang"
    else:
        assert response.status_code == 200, response.text

    start = time.monotonic()
    wait_for("/readyz 200 again", lambda: get(f"{stack.url}/readyz").status_code == 200, timeout=180)
    report["triton_crash_recovery_s"] = round(time.monotonic() - start, 1)
    assert post(stack, "/rerank", {"query": QUERY, "documents": DOCS}).status_code == 200
    assert inspect(triton, "container")["RestartCount"] > restarts
    after = inspect(gateway, "container")
    assert after["State"]["StartedAt"] == gateway_started and after["RestartCount"] == 0


def distributions(tag: str) -> dict[str, dict]:
    """Installed distributions of an image's /opt/keyrank venv: requires, size, native libraries."""
    script = r"""
import importlib.metadata as m, json, os
out = {}
for d in m.distributions():
    files = [str(f) for f in (d.files or [])]
    size = sum(os.path.getsize(p) for f in (d.files or []) if os.path.isfile(p := str(d.locate_file(f))))
    out[d.metadata["Name"].lower().replace("_", "-")] = {"requires": d.requires or [], "size": size,
        "native": sorted({f.split("/")[0] for f in files if ".so" in f.rsplit("/", 1)[-1]})}
print(json.dumps(out))
"""
    return json.loads(run("docker", "run", "--rm", "--entrypoint", "python", tag, "-c", script).stdout)


def requirement_closure(dists: dict[str, dict], root: str) -> set[str]:
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    environment = default_environment() | {"python_version": "3.11", "python_full_version": "3.11.2"}
    wanted, todo = set(), [(root, frozenset())]
    while todo:
        name, extras = todo.pop()
        key = (name, extras)
        if key in wanted:
            continue
        wanted.add(key)
        for spec in dists.get(name, {}).get("requires", []):
            req = Requirement(spec)
            if req.marker and not any(req.marker.evaluate(environment | {"extra": e}) for e in (extras or {""})):
                continue
            todo.append((req.name.lower().replace("_", "-"), frozenset(req.extras)))
    return {name for name, _ in wanted}


def test_gateway_image_holds_only_what_the_gateway_runs(stack, images):
    tag = images["keyrank-gateway"]
    absent = ("torch", "transformers", "pytest", "hypothesis", "sklearn", "locust", "sentence_transformers", "pip",
              "setuptools")
    probe = "import importlib.util as u, shutil; print([m for m in %r if u.find_spec(m)], " \
            "[c for c in ('gcc', 'cc', 'g++', 'make') if shutil.which(c)])" % (absent,)
    result = run("docker", "run", "--rm", "--entrypoint", "python", tag, "-c", probe)
    assert result.stdout.strip() == "[] []", f"present in the gateway image: {result.stdout}"

    dists = distributions(tag)
    needed = requirement_closure(dists, "keyrank") - UNUSED
    assert set(dists) == needed, f"installed but not required: {set(dists) - needed}; missing: {needed - set(dists)}"

    # Native code the running gateway has not loaded after serving every request kind above.
    maps = run("docker", "exec", stack.container("gateway"), "cat", "/proc/1/maps").stdout
    loaded = set(re.findall(r"site-packages/([^/\s]+)", maps))  # a package folder or a top-level extension
    unloaded = {name: d["size"] for name, d in dists.items() if d["native"] and not set(d["native"]) & loaded}
    # uvicorn[standard]'s reloader (watchfiles) and websockets' speedups only load in dev/websocket use.
    assert set(unloaded) <= {"watchfiles", "websockets", "pyyaml"}, unloaded

    largest = sorted(((d["size"], n) for n, d in dists.items()), reverse=True)[:8]
    report["gateway_largest_mb"] = {n: round(s / 1e6, 1) for s, n in largest}
    report["gateway_unloaded_native"] = {n: round(s / 1e6, 1) for n, s in unloaded.items()}
    write_report()


def test_images_carry_oci_labels_and_the_package_version_tag(images):
    for name, tag in images.items():
        assert tag == f"{name}:{VERSION}"
        labels = inspect(tag)["Config"]["Labels"]
        assert labels["org.opencontainers.image.version"] == VERSION, name
        assert labels["org.opencontainers.image.title"] == name, name
        assert labels["org.opencontainers.image.licenses"] == "Apache-2.0", name
        assert labels["org.opencontainers.image.source"], name


def healthcheck_path(tag: str) -> str:
    test = " ".join(inspect(tag)["Config"]["Healthcheck"]["Test"])
    return re.search(r"127\.0\.0\.1:[^/]*(/[\w/]+)", test).group(1)


def test_chart_defaults_match_what_the_images_expose(images):
    import yaml

    helm = Path(os.environ.get("KEYRANK_TOOLS_DIR", REPO / ".tools")) / "bin" / "helm"
    if not helm.exists():
        pytest.skip("helm not installed (make tools)")
    rendered = run(str(helm), "template", "keyrank", str(REPO / "k8s" / "keyrank"), "--namespace", "search").stdout
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    deployments = {o["metadata"]["name"].rsplit("-", 1)[-1]: o for o in objects if o["kind"] == "Deployment"}
    pods = {k: d["spec"]["template"]["spec"] for k, d in deployments.items()}

    gateway = next(c for c in pods["gateway"]["containers"] if c["name"] == "gateway")
    repository, tag = gateway["image"].rsplit(":", 1)
    assert repository.rsplit("/", 1)[-1] == "keyrank-gateway" and tag == VERSION
    image = inspect(images["keyrank-gateway"])["Config"]
    assert {f"{p['containerPort']}/tcp" for p in gateway["ports"]} == set(image["ExposedPorts"])
    assert gateway["livenessProbe"]["httpGet"]["path"] == healthcheck_path(images["keyrank-gateway"])
    assert gateway["securityContext"].get("runAsUser", pods["gateway"]["securityContext"]["runAsUser"]) == \
        int(image["User"].split(":")[0])

    prepare = next(c for c in pods["gateway"]["initContainers"] if c["name"] == "prepare-models")
    repository, tag = prepare["image"].rsplit(":", 1)
    assert repository.rsplit("/", 1)[-1] == "keyrank-prepare" and tag == VERSION

    # The chart's Triton is the NGC image (docker/triton); the CPU image exposes the same ports and health path.
    triton = next(c for c in pods["triton"]["containers"] if c["name"] == "triton")
    cpu = inspect(images["keyrank-triton-cpu"])["Config"]
    assert {f"{p['containerPort']}/tcp" for p in triton["ports"] if p["name"] in {"http", "grpc", "metrics"}} \
        == set(cpu["ExposedPorts"])
    assert triton["readinessProbe"]["httpGet"]["path"] == healthcheck_path(images["keyrank-triton-cpu"])
    assert pods["triton"]["securityContext"]["runAsUser"] == int(cpu["User"].split(":")[0])


# --- several Triton replicas behind one name ------------------------------------------------------


def replicas(stack: Stack) -> list[str]:
    """The running Triton containers of the stack, oldest first."""
    ids = run("docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={stack.project}",
              "--filter", "label=com.docker.compose.service=triton").stdout.split()
    return sorted(ids, key=lambda c: inspect(c, "container")["Created"])


def served_by(container: str) -> int:
    """Inferences of the cross-encoder this replica answered, from its own Triton metrics (read inside it)."""
    script = ("import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8002/metrics', timeout=5)"
              ".read().decode())")
    text = run("docker", "exec", container, "python3", "-c", script, timeout=30).stdout
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("nv_inference_request_success{") and 'model="cross_encoder"' in line)


class Load:
    """Small rankings (one Triton call each) from 4 clients until stopped: every answer (time, status, Retry-After)."""

    def __init__(self, stack: Stack):
        import httpx

        self.answers: list[tuple[float, int, str | None]] = []
        self._stop = threading.Event()
        body = {"query": QUERY, "documents": DOCS[:1], "strategy": "firstp"}

        def client() -> None:
            with httpx.Client(timeout=60) as http:
                while not self._stop.is_set():
                    try:
                        response = http.post(f"{stack.url}/rerank", json=body)
                        self.answers.append((time.monotonic(), response.status_code, response.headers.get("retry-after")))
                    except httpx.HTTPError as exc:
                        self.answers.append((time.monotonic(), 0, repr(exc)))

        self._threads = [threading.Thread(target=client, daemon=True) for _ in range(4)]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(90)


def shares(counts: dict[str, int]) -> dict[str, float]:
    total = sum(counts.values()) or 1
    return {c[:12]: round(n / total, 3) for c, n in counts.items()}


def test_every_triton_replica_carries_traffic_and_a_lost_one_costs_no_request(stack):
    """`--scale triton=3` behind one name (Docker's DNS answers with every replica, as a headless Service does):
    replicas added under load are found within the connection age; calls spread evenly; a killed replica costs
    no request; a paused one (a black hole: its kernel still takes TCP) is dropped within the keepalive timeout,
    with readiness true throughout. Counts from each replica's own Triton metrics."""
    age_s = 30  # docker-compose.yml's default --grpc-max-connection-age
    load = Load(stack)
    figures: dict[str, object] = {}
    try:
        # 1 -> 3 under load
        time.sleep(3)
        stack("up", "-d", "--no-build", "--no-recreate", "--scale", "triton=3", "triton", timeout=300)
        scaled = time.monotonic()
        wait_for("3 triton replicas healthy", lambda: len(replicas(stack)) == 3 and all(
            inspect(c, "container")["State"].get("Health", {}).get("Status") == "healthy" for c in replicas(stack)),
            timeout=240)
        healthy = time.monotonic() - scaled
        new = replicas(stack)[1:]

        def new_ones_carry() -> dict[str, float] | None:
            before = {c: served_by(c) for c in replicas(stack)}
            time.sleep(3)
            window = shares({c: served_by(c) - before[c] for c in before})
            return window if all(window[c[:12]] >= 0.2 for c in new) else None

        window = wait_for("the added replicas carry >= 20% each", new_ones_carry, timeout=age_s + 10 + 15, interval=0)
        figures["scale_up"] = {"healthy_s": round(healthy, 1), "carrying_s": round(time.monotonic() - scaled, 1),
                               "after_healthy_s": round(time.monotonic() - scaled - healthy, 1), "window_shares": window}

        # balance over 300+ requests
        before = {c: served_by(c) for c in replicas(stack)}
        wait_for("300 requests", lambda: sum(served_by(c) - before[c] for c in before) >= 300, timeout=180, interval=2)
        balance = shares({c: served_by(c) - before[c] for c in before})
        figures["balance"] = balance
        assert all(abs(share - 1 / 3) <= 0.10 for share in balance.values()), balance

        # kill one: nothing lost, the survivors take the load within 5 s
        victim, *survivors = replicas(stack)
        sent_before_kill = len(load.answers)
        run("docker", "kill", victim)
        killed = time.monotonic()
        time.sleep(5)
        before = {c: served_by(c) for c in survivors}
        time.sleep(5)
        taken = {c[:12]: served_by(c) - before[c] for c in survivors}
        after_kill = load.answers[sent_before_kill:]
        bad = [a for a in after_kill if a[1] != 200]
        figures["kill"] = {"answers": len(after_kill), "not_200": len(bad), "survivors_5_to_10_s": taken}
        assert all(status == 503 and retry for _, status, retry in bad), bad[:5]
        assert len(bad) <= 0.01 * len(after_kill), bad[:5]
        assert all(n > 0 for n in taken.values()), taken

        # pause one: dropped within the keepalive timeout (5 s + 5 s), readiness stays true
        paused, other = survivors
        run("docker", "pause", paused)
        try:
            stopped = time.monotonic()
            ready = []
            while time.monotonic() - stopped < 15:
                ready.append(get(f"{stack.url}/readyz").status_code)
                time.sleep(0.5)
            sent = [a for a in load.answers if a[0] > stopped + 12]
            assert len(sent) >= 5 and all(status == 200 for _, status, _ in sent), sent[:5]
            assert set(ready) == {200}, ready
            slow_until = max((t for t, *_ in load.answers if t > stopped), default=stopped) - stopped
            figures["pause"] = {"readyz": sorted(set(ready)), "answers_after_12_s": len(sent), "answered_until_s": round(slow_until, 1)}
        finally:
            run("docker", "unpause", paused, check=False)
    finally:
        load.stop()
        report["replicas"] = figures
        write_report()
        print(f"\nthree Triton replicas: {json.dumps(figures)}")
    statuses = [status for _, status, _ in load.answers]
    assert statuses.count(0) == 0 and len(statuses) > 600
    stack("up", "-d", "--no-build", "--scale", "triton=1", "triton", timeout=300, check=False)


def test_compose_down_removes_every_container_network_and_volume(stack):
    result = stack.down()
    assert result.returncode == 0, result.stderr
    assert stack.leftovers() == {"containers": [], "networks": [], "volumes": []}
