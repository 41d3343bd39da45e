"""All settings in one place: read from the environment (prefix ``KEYRANK_``).

Defaults are the papers' parameters (DESIGN.md) and limits a shared service
can live with; every limit is answered by a 4xx that names it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection
from functools import lru_cache
from pathlib import Path
from typing import Literal, get_args

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from keyrank.names import SELECTORS, STRATEGIES
from keyrank.scoring.buckets import LENGTH_BUCKETS, LENGTH_MULTIPLE

# The one list of names (names.py, a row each in the strategy and selector registries): these types, the
# API's enums and the docs derive from it.
Strategy = Literal[STRATEGIES]  # type: ignore[valid-type]
Selector = Literal[SELECTORS]  # type: ignore[valid-type]


def _optional_number(annotation: object) -> bool:
    """``int | None`` or ``float | None``."""
    args = get_args(annotation)
    return type(None) in args and any(a in (int, float) for a in args)


class Settings(BaseSettings):
    """Service configuration; every field can be set as ``KEYRANK_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="KEYRANK_", env_file=None, extra="ignore")

    # --- where things are ---------------------------------------------------
    model_dir: Path = Field(Path("models"), description="Output of `keyrank prepare`: triton/, triton-embedded/, gateway/.")
    triton_url: str | None = Field(None, description="host:port of an external Triton's gRPC endpoint; unset = embedded Triton started by `keyrank serve`.")
    triton_model: str = Field("cross_encoder", description="Name of the cross-encoder in the Triton repository.")
    models: str | None = Field(None, description="Several prepared models served side by side, 'name=folder,name=folder' (`keyrank serve --models`): a request's `model` picks one by name, answers report that name, and each is the Triton model of that name (external Triton: one entry per name). Unset = one model from model_dir, named by model_name.")
    default_model: str | None = Field(None, description="The model of a request that names none: one of the names in models; unset = the first.")
    host: str = Field("127.0.0.1", description="Gateway bind address.")
    port: int = Field(8080, description="Gateway port.")
    workers: int = Field(1, description="Uvicorn worker processes (each with its own Triton client).")
    # Where the judged data sits changes no score: kept out of model_dump, so what is keyed by a dump of the
    # settings (training caches, eval checkpoints, training.json) does not depend on it.
    eval_data_dir: Path = Field(Path("../shared/datasets"), exclude=True, description="The judged data (qmsum/, trec-dl20-passage/, squad2-dev-half/), read where it is, never copied: by `keyrank eval`, `finetune` and `bench`, and for the playground's QMSum meeting; relative to the current folder. `keyrank prepare`'s quality gate reads its default unless --gate-datasets says otherwise.")

    # --- model input shape (papers) ----------------------------------------
    max_sequence_length: int = Field(512, description="Longest model input, the template's frame included; the model's own limit caps it. Every strategy but longp reads at most this.")
    longp_max_length: int = Field(8192, ge=1, description="Longest longp input, the template's frame included: the model's own limit (from its config at `keyrank prepare`), capped at this. Widths past length_buckets are warmed up and sent up to it, so it bounds the model server's memory too (docs/PERFORMANCE.md, LongP).")
    query_max_tokens: int = Field(32, description="Query tokens fed to the model (KeyB2/PARADE use 32); longer queries are cut.")
    keyb2_budget_tokens: int = Field(480, description="Document tokens of selected blocks (KeyB2); capped by what fits next to the query.")
    block_max_tokens: int = Field(63, description="CogLTX block size limit in tokens.")
    block_cost: float = Field(1.0, description="Per-block cost in the segmentation DP, so blocks are not needlessly short.")
    window_stride: int | None = Field(None, description="MaxP/SumP stride in tokens; unset = half a window.")
    max_windows_per_doc: int = Field(64, description="Cap on windows per document (maxp/sump/avgp/parade); cuts are reported.")
    window_cap_by: Literal["bm25", "first"] = Field("bm25", description="Which windows a document more than the cap (max_windows_per_doc, or the request's) keeps: 'bm25' = the best by BM25 against the query (the bm25 selector's settings), in document order; 'first' = the first ones (the text past them is never read). Chosen on dev: docs/EXPERIMENTS.md, 2026-11-27.")

    # --- selectors -----------------------------------------------------------
    bm25_k1: float = Field(0.9, description="BM25 k1 (Anserini default).")
    bm25_b: float = Field(0.4, description="BM25 b (Anserini default).")
    bm25_idf: Literal["document", "table", "general", "request"] = Field("document", description="Where BM25's IDF comes from: 'document' = the document's own blocks; 'table' = bm25_idf_table (`keyrank idf`); 'general' = the table shipped with keyrank; 'request' = all blocks of the request's candidates (a document's score then depends on the others). All but 'request' give a document the same score in any request (docs/SELECTION.md).")
    bm25_idf_table: Path | None = Field(None, description="JSON {term: idf} (`keyrank idf --docs corpus.jsonl --out idf.json`) for bm25_idf=table; setting it alone selects 'table'.")
    dense_cache_size: int = Field(200_000, description="Block embeddings kept in the dense selector's LRU cache.")
    dense_batch_size: int = Field(64, description="Blocks per bi-encoder run on OpenVINO; ONNX Runtime always runs 8 (select/dense.py, ORT_ROWS: the same vectors whatever the other blocks).")
    dense_threads: int = Field(0, description="Threads of the bi-encoder's runtime; 0 = its default (OpenVINO: the usable cores).")
    dense_runtime: Literal["auto", "onnxruntime", "openvino"] = Field("auto", description="What runs the dense selector's bi-encoder: 'auto' = OpenVINO in bf16 where the CPU computes bfloat16 (AVX512_BF16, AMX) and OpenVINO is installed, else ONNX Runtime fp32; 'openvino' (bf16 where the CPU has it, else f32); 'onnxruntime' (fp32). Measured: docs/PERFORMANCE.md section 7.")
    hybrid_rrf_k: float = Field(60.0, description="Reciprocal rank fusion constant of the hybrid selector (BM25 + dense; Cormack et al. use 60).")
    keyb2_budget: Literal["paper480", "fill"] = Field("paper480", description="KeyB2 document budget: 'paper480' = keyb2_budget_tokens capped to what fits; 'fill' = all that fits next to the query (512 - 3 - q for BERT).")
    keyb2_block_order: Literal["document", "score"] = Field("document", description="KeyB2 reads its chosen blocks as the text runs ('document', the papers) or best-scored first ('score'); train and serve alike.")
    keyb2_min_score_share: float | None = Field(0.5, ge=0.0, le=1.0, description="KeyB2 with the bm25 selector reads only blocks scoring at least this share of the document's best block (an adaptive budget, chosen on dev: docs/SELECTION.md); 0 or unset = fill the budget as the papers do.")
    keyb2_blocks: int = Field(6, ge=1, le=64, description="keyb2-blocks reads a document's this many best blocks by the selector, in short inputs with the query (keyb2_blocks_span); chosen on dev (docs/EXPERIMENTS.md, 2026-11-27).")
    keyb2_blocks_span: int = Field(4, ge=1, le=8, description="keyb2-blocks reads chosen blocks that follow each other in the text together, up to this many blocks (and what fits) an input, so a passage cut across blocks keeps its context; 1 = each block alone. Chosen on dev (docs/EXPERIMENTS.md, 2026-11-27).")
    keyb2_blocks_lead: int | None = Field(4, ge=0, le=63, description="keyb2-blocks: an input that does not open its document starts this many tokens before the first rare query term it holds, its blocks before that one dropped (the text before the query there is usually the end of what came before); None = whole blocks. Chosen on dev (docs/EXPERIMENTS.md, 2026-11-27).")
    keyb2_blocks_length_bias: float = Field(0.0, ge=-2.0, le=2.0, description="keyb2-blocks: each input's logit plus this x ln(its tokens / 128) before log-sum-exp, so that a scorer fine-tuned on 512-token inputs weighs short and long inputs alike; 0 for the base scorer. `keyrank finetune` chooses it on dev for the scorer it trains and writes it into the model's serving file (docs/EXPERIMENTS.md, 2026-12-02).")
    keyb2_keep_lead: bool = Field(False, description="KeyB2 always reads block 0 (documents often state their topic first).")
    keyb2_neighbours: bool = Field(False, description="KeyB2 top blocks fill keyb2_top_share of the budget, then their neighbours are added while they fit.")
    keyb2_top_share: float = Field(0.5, gt=0.0, le=1.0, description="With keyb2_neighbours: share of the budget the top-scored blocks may fill.")
    keyb2_dedup_jaccard: float | None = Field(None, gt=0.0, le=1.0, description="KeyB2 skips a block whose token set has at least this Jaccard with a chosen block; unset = off.")
    keyb2_shared_share: float | None = Field(None, gt=0.0, le=1.0, description="KeyB2 does not choose by score a block whose text (at least half of its 8-token shingles) at least this share of the request's other candidates also contain: text every candidate carries tells them apart by nothing. Unset = off (the default): a document's selection then depends on the other candidates.")
    keyb2_passes: int = Field(1, ge=1, le=3, description="KeyB2 model inputs per document: the best blocks fill the first, the next best the second, up to 3 (a pass with no block left is not scored); the document's score is the best pass's. 1 = the papers' one reading (docs/EVALUATION.md: the quality-vs-tokens curve). keyb2-parade-avg/max fold the passes' pooled vectors instead and read at least 2 (their rows' least_passes).")
    keyb2_fusion_weight: float = Field(0.0, ge=0.0, description="KeyB2 document score + this weight x the document's best selector block score, z-normalised over the request's documents. 0 = off (the default): above 0 a score depends on the other candidates.")

    # --- document cache (doc_cache.py) -----------------------------------------
    document_cache_bytes: int = Field(256 * 2**20, ge=0, description="Bytes of tokens, blocks and BM25 terms kept per gateway process and per served model for documents seen before (by content hash, LRU); 0 = off. About 30 bytes per document token.")

    tokenize_word_cache: Literal["auto", "on", "off"] = Field("auto", description="Plain-ASCII documents split into words in Python, each distinct word's word pieces cached ('on', about a third of the CPU time of a cold plan on one thread), or encoded by the tokenizer's Rust batch over all cores ('off'); the same ids and offsets either way. 'auto' = on below 6 usable cores per worker process (a container's CPU limit and RAYON_NUM_THREADS count where set). docs/PERFORMANCE.md section 2.")

    # --- Triton client -------------------------------------------------------
    length_buckets: list[int] = Field(list(LENGTH_BUCKETS), description="Sequences are padded to the smallest bucket that fits, so Triton's dynamic batcher can merge them.")
    length_bucket_shapes: int = Field(4, ge=0, description="Per request, pad to at most this many widths chosen from its own lengths (multiples of length_bucket_multiple, never more padding than length_buckets); 0 = length_buckets as they are.")
    length_bucket_multiple: int = Field(LENGTH_MULTIPLE, ge=1, description="Chosen widths are multiples of this, so requests share shapes (Triton's batcher merges equal shapes).")
    triton_batch_size: int = Field(32, description="Sequences per Triton request.")
    triton_max_in_flight: int = Field(8, description="Concurrent Triton requests per gateway process.")

    # --- deadlines and failure ----------------------------------------------
    request_timeout_s: float = Field(30.0, description="Deadline for one /rerank; past it the answer is 503.")
    triton_connect_timeout_s: float = Field(1.0, description="Health/readiness probe timeout towards Triton.")
    triton_balancing: Literal["round_robin", "pick_first"] = Field("round_robin", description="How the gateway spreads its Triton calls over the addresses triton_url resolves to: 'round_robin' = every call to the next ready replica (a headless Service, or Docker's DNS with `--scale`, gives every replica's address; new ones are found when Triton ages a connection out), and a call refused with UNAVAILABLE is retried on another; 'pick_first' = one connection to the first address, for a service mesh (Linkerd, Istio) that balances itself.")
    triton_keepalive_s: float = Field(5.0, ge=0, description="Seconds between keepalive pings on each Triton connection, calls or none (0 = off): a replica that stops answering (lost node, black-holed network) is dropped after this plus triton_keepalive_timeout_s instead of when TCP gives up (~15 min). Triton must permit pings this often (--grpc-keepalive-permit-without-calls=1, --grpc-http2-min-recv-ping-interval-without-data below this; the chart, compose and the embedded Triton set them).")
    triton_keepalive_timeout_s: float = Field(5.0, gt=0, description="Seconds a keepalive ping may go unanswered before the connection is closed and its calls go to other replicas.")
    retry_after_s: int = Field(1, description="Retry-After header on 503.")
    keep_alive_s: float = Field(5.0, gt=0, description="Idle seconds a keep-alive connection stays open (uvicorn's timeout_keep_alive, keyrank serve). A 429 or 503 whose Retry-After is as long or longer closes its connection (Connection: close): a client that waits and retries then opens a new one instead of writing into one the server has closed.")
    shutdown_grace_s: float = Field(10.0, gt=0, description="On SIGTERM, seconds in-flight requests may still finish; those running past it get 503 + Retry-After (keyrank serve). Kubernetes' terminationGracePeriodSeconds must exceed it (the chart checks).")

    # --- admission control (admission.py: 429 before any tokenizing) ----------
    max_queued_sequences: int | None = Field(None, ge=1, description="Most admitted, unfinished work in estimated cross-encoder sequences; beyond it 429 + Retry-After. Unset = sized from capacity: the measured drain rate times half the request deadline.")
    capacity_sequences_per_s: float = Field(4.0, gt=0, description="Drain rate assumed until one is measured (4 = the embedded CPU Triton, MiniLM-L6, 512-token sequences, 2 cores; GPU Triton drains hundreds).")

    # --- fairness (scoring/fairness.py: small requests never wait behind a heavy one) ----------
    small_request_sequences: float = Field(16.0, gt=0, description="A request estimated at most this many cross-encoder sequences is small: it is admitted from a reserve heavy requests cannot fill (a quarter of the admission bound), and its batches are scored ahead of costlier requests' (shortest expected first).")
    heavy_batch_size: int | None = Field(None, ge=1, description="Sequences per Triton request of a heavy (not small) request, fixed. Unset = sized when the batch's slot is granted on the embedded CPU Triton (what it drains in KEYRANK_HEAVY_BATCH_MS, one sequence while small requests are about), triton_batch_size on an external Triton (a GPU wants full batches).")
    heavy_batch_ms: float = Field(100.0, gt=0, description="How long one batch of a heavy request may keep the model server while no small request is about, when heavy batches are sized (KEYRANK_HEAVY_BATCH_SIZE unset on the embedded Triton). Longer batches drain faster; a small request arriving cancels it (its sequences are sent again), so it does not wait for it.")
    heavy_yield_s: float = Field(1.0, ge=0, description="After a small request's batch, sized heavy batches are one sequence each for this long (0 = never).")
    heavy_in_flight: int | None = Field(None, ge=1, description="Triton requests of heavy requests in flight at once per gateway process. Unset = 2 on the embedded CPU Triton (one runs, one waits in Triton's queue, so the model server never idles between them; a small request's batch cancels the waiting one), triton_max_in_flight on an external Triton.")

    # --- request limits (each a named 4xx) ----------------------------------
    max_body_bytes: int = Field(16 * 1024 * 1024, description="Largest accepted request body (413).")
    header_read_timeout_s: float = Field(10.0, gt=0, description="A request's line and headers must arrive within this many seconds of the connection opening or the previous response; else the connection is closed (keyrank serve).")
    body_read_timeout_s: float = Field(10.0, gt=0, description="The whole request body must arrive within this many seconds of the headers (408), so a partial request cannot hold a connection open.")
    max_documents: int = Field(1000, description="Most documents per request (422).")
    max_document_chars: int = Field(400_000, description="Most characters per document (422).")
    max_query_chars: int = Field(2_000, description="Most characters in the query (422).")

    # --- API -------------------------------------------------------------------
    api_key: SecretStr | None = Field(None, description="If set, requests need `Authorization: Bearer <key>`.")
    model_name: str | None = Field(None, description="What answers report as `model`; unset = the prepared model's folder name or hub id.")
    default_strategy: Strategy = Field("keyb2-blocks", description="Strategy of a request that names none (README, \"Strategies\"). One a served model cannot serve (longp on a 512-position model, a strategy whose trained part is missing) stops the start naming this setting (`keyrank serve` exits 2 before Triton starts).")
    default_selector: Selector = Field("bm25", description="Block selector of a request that names none, for the strategies that select blocks (keyb2, keyb2-blocks and their variants; README, \"Strategies\"); `dense` and `hybrid` need the bi-encoder `keyrank prepare` exports, checked at start like default_strategy.")
    playground: bool = Field(True, description="Serve the /playground page (a ranking with its evidence highlighted), behind api_key when one is set; false = 404.")

    # --- embedded Triton (keyrank serve without --triton-url) ---------------
    embedded_http_port: int = Field(0, description="Embedded Triton HTTP port (loopback only); 0 = a free port, a taken one fails at start.")
    embedded_grpc_port: int = Field(0, description="Embedded Triton gRPC port (loopback only); 0 = a free port, a taken one fails at start.")
    embedded_metrics_port: int = Field(0, description="Embedded Triton metrics port (loopback only); 0 = a free port, a taken one fails at start.")
    embedded_max_repairs: int = Field(5, description="Failed model reloads / Triton restarts in a row (one whose fault is back within 10 s counts as failed) before the supervisor gives up and `serve` exits non-zero.")
    embedded_repair_backoff_s: float = Field(1.0, description="Wait before the 2nd repair in a row, doubling for each further one (capped at 30 s).")
    embedded_instances: int = Field(1, description="Model instances in the embedded Triton.")
    embedded_nice: int = Field(10, ge=0, le=19, description="Niceness added to the embedded Triton and its model processes on the CPU: on a machine whose cores the model fills, the gateway's own work (parsing, tokenizing, selecting key blocks) is not kept waiting by it, and a small request's latency behind a heavy one's stays low. 0 = as the gateway; the GPU variant gets 0.")
    embedded_ready_timeout_s: float = Field(120.0, description="How long `serve` waits for the embedded model to load.")
    embedded_device: Literal["cpu", "cuda"] = Field("cpu", description="Embedded Triton model: 'cpu' = triton-embedded/ (the CPU variant `keyrank prepare` chose: OpenVINO in bf16 where the CPU has bfloat16, else OpenVINO fp32 or ONNX Runtime; GET /v1/models says which); 'cuda' = triton-embedded-cuda/ (PyTorch on the GPU, written by `keyrank prepare --device cuda`). Also read by that model (KEYRANK_EMBEDDED_DEVICE).")
    embedded_cuda_runtime: Literal["torch", "onnxruntime"] = Field("torch", description="With embedded_device 'cuda': 'torch' = triton-embedded-cuda/ (PyTorch); 'onnxruntime' = triton-embedded-cuda-ort/ (the fp16 graph on ONNX Runtime's CUDA provider, onnxruntime-gpu; both written by `keyrank prepare --device cuda`).")
    embedded_dtype: Literal["bfloat16", "float16", "float32"] = Field("bfloat16", description="Precision of the GPU variant's model (KEYRANK_EMBEDDED_DTYPE overrides its config).")
    embedded_cuda_graphs: bool = Field(False, description="GPU variant: replay a captured CUDA graph per (batch, width) instead of launching each kernel (KEYRANK_EMBEDDED_CUDA_GRAPHS).")
    embedded_compile: bool = Field(False, description="GPU variant: run the transformer body through torch.compile (fused elementwise kernels; the first batch pays the compilation) (KEYRANK_EMBEDDED_COMPILE).")
    triton_server_id: str | None = Field(None, description="Set by `keyrank serve` to its embedded Triton's --id: readiness then requires the server at triton_url to report it (not another process on that port).")

    @field_validator("*", mode="before")
    @classmethod
    def _none_unsets_a_number(cls, value: object, info: ValidationInfo) -> object:
        """``none`` unsets a number that may be unset (``KEYRANK_KEYB2_BLOCKS_LEAD=none``); a text setting (a key,
        a URL, a path) keeps the word as it is."""
        if isinstance(value, str) and value.strip().lower() == "none" and _optional_number(cls.model_fields[info.field_name].annotation):
            return None
        return value

    @model_validator(mode="after")
    def _idf_source(self) -> Settings:
        if self.bm25_idf_table is not None and "bm25_idf" not in self.model_fields_set:
            self.bm25_idf = "table"  # KEYRANK_BM25_IDF_TABLE alone, as before 2026-11-25: the table is what is wanted
        if self.bm25_idf == "table" and self.bm25_idf_table is None:
            raise ValueError("bm25_idf=table needs bm25_idf_table (KEYRANK_BM25_IDF_TABLE): a JSON {term: idf}, e.g. from `keyrank idf`")
        if self.bm25_idf != "table" and self.bm25_idf_table is not None:
            raise ValueError(f"bm25_idf_table is set but bm25_idf={self.bm25_idf} does not read it: unset one or set bm25_idf=table")
        return self

    def check_files(self) -> None:
        """Raise BadSetting, naming the variable, for a file setting the service would fail to read at start
        (after its Triton is up): the IDF table must be a JSON object (`keyrank idf` writes one)."""
        table = self.bm25_idf_table
        if table is None or self.bm25_idf != "table":
            return
        where = f"{variable('bm25_idf_table')}={table}"
        if not Path(table).is_file():
            raise BadSetting(f"{where}: no such file (a JSON {{term: idf}}, e.g. from `keyrank idf --docs corpus.jsonl --out idf.json`)")
        try:
            import gzip

            opener = gzip.open if Path(table).suffix == ".gz" else open  # as select/bm25.py reads it
            with opener(table, "rt", encoding="utf-8") as f:
                parsed = json.load(f)
        except (OSError, EOFError, UnicodeDecodeError, ValueError) as exc:
            raise BadSetting(f"{where}: not a JSON file ({exc})") from None
        if not isinstance(parsed, dict):
            raise BadSetting(f"{where}: a JSON {{term: idf}} object expected, found a {type(parsed).__name__}")

    def with_overrides(self, **overrides: object) -> Settings:
        """A copy with some fields replaced, validated like the environment would be."""
        if not overrides:
            return self
        # dict(self) and not model_dump(): the copy keeps the fields a dump leaves out (eval_data_dir).
        return type(self).model_validate({**dict(self), **overrides})

    def served_models(self) -> dict[str, Path]:
        """``models`` as {name: folder}, the default first; {} when unset (one model, ``model_dir``).
        Raises ValueError naming the setting for a malformed list or an unknown default."""
        if not self.models:
            if self.default_model:
                raise ValueError("default_model (KEYRANK_DEFAULT_MODEL) is set but models (KEYRANK_MODELS) is not: name the models to choose from")
            return {}
        served: dict[str, Path] = {}
        for entry in self.models.split(","):
            name, sep, folder = (part.strip() for part in entry.partition("="))
            if not sep or not folder or not MODEL_NAME_PATTERN.fullmatch(name):
                raise ValueError(
                    f"models (KEYRANK_MODELS): {entry.strip()!r} is not name=folder with a name of letters, digits, '.', '_', '-' "
                    "(at most 64, starting with a letter or digit), e.g. base=models,ft=models-ft"
                )
            if name in served:
                raise ValueError(f"models (KEYRANK_MODELS): the name {name!r} is given twice")
            served[name] = Path(folder)
        default = self.default_model or next(iter(served))
        if default not in served:
            raise ValueError(f"default_model (KEYRANK_DEFAULT_MODEL) {default!r} is not one of models: {', '.join(served)}")
        return {default: served[default], **served}

    def for_model(self, name: str, folder: Path) -> Settings:
        """The settings of one served model: its folder, its Triton model (its name), the name answers report."""
        return self.with_overrides(model_dir=folder, triton_model=name, model_name=name)

    def graph_model(self, graph: str) -> str:
        """Triton's name for this model's interaction graph ``graph`` (``<kind>-features``): the graph's own, as
        `keyrank finetune --install-into` writes it beside the one cross-encoder; ``<model>:<graph>`` when
        KEYRANK_MODELS serves several models from one repository (``served_graph_name``)."""
        return served_graph_name(self.triton_model, graph) if self.models else graph

    def longest_input(self, model_max_length: int) -> int:
        """The longest input any strategy builds for a model that reads ``model_max_length`` tokens: the
        widest shape the scorers send and Triton is warmed up with."""
        return min(model_max_length, max(self.max_sequence_length, self.longp_max_length))

    @property
    def gateway_dir(self) -> Path:
        """Gateway-side assets: tokenizer, classifier head, bi-encoder."""
        return self.model_dir / "gateway"

    def embedded_repository(self, device: str | None = None, cuda_runtime: str | None = None) -> Path:
        """The embedded Triton repository `keyrank prepare` wrote for ``device`` (default ``embedded_device``):
        triton-embedded/ (CPU: ONNX Runtime or OpenVINO); on CUDA (``--device cuda``), as ``cuda_runtime`` (default
        ``embedded_cuda_runtime``) says, triton-embedded-cuda/ (PyTorch) or triton-embedded-cuda-ort/ (ONNX Runtime, fp16)."""
        if (device or self.embedded_device) != "cuda":
            return self.model_dir / "triton-embedded"
        ort = (cuda_runtime or self.embedded_cuda_runtime) == "onnxruntime"
        return self.model_dir / ("triton-embedded-cuda-ort" if ort else "triton-embedded-cuda")


MODEL_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A served model's name: also its Triton model name and a folder name in the embedded repository."""


def served_graph_name(model: str, graph: str) -> str:
    """The Triton model of served model ``model``'s interaction graph ``graph`` in a repository of several models:
    ``base:cedr-knrm-features``. A served name has no ':' (MODEL_NAME_PATTERN), so neither another model nor
    another model's graph can take this name."""
    return f"{model}:{graph}"

ENV_FILE_VARIABLE = "KEYRANK_ENV_FILE"
"""Names a file of ``KEYRANK_*=value`` lines read under the environment (which wins), e.g. what
``keyrank tune`` writes; docker ``--env-file`` and compose ``env_file:`` read the same file."""


class BadSetting(ValueError):
    """A ``KEYRANK_*`` value (or the env file) the settings cannot take, said in one line that names the
    variable and what it expects: what ``keyrank`` prints (exit 2) instead of a traceback."""


ENV_PREFIX: str = Settings.model_config["env_prefix"]


def variable(field: str) -> str:
    """The environment variable of a settings field: ``port`` -> ``KEYRANK_PORT``."""
    return f"{ENV_PREFIX}{field.upper()}"


def bad_setting(error: Exception) -> BadSetting | None:
    """``error`` as a BadSetting when the settings raised it (pydantic's ValidationError of ``Settings``, or
    pydantic-settings' parse error of a list value): one line per problem, each naming its variable, what it
    was given and what it expects. None for any other error."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    if isinstance(error, ValidationError) and error.title == Settings.__name__:
        lines = []
        for problem in error.errors(include_url=False):
            message = str(problem["msg"]).removeprefix("Value error, ")
            if problem["loc"] and problem["loc"][0] in Settings.model_fields:
                given = problem.get("input")
                shown = f"={given}" if isinstance(given, str | int | float) else ""
                message = f"{variable(str(problem['loc'][0]))}{shown}: {message}"
            lines.append(message)
        return BadSetting("; ".join(lines))
    if isinstance(error, SettingsError):
        # 'error parsing value for field "length_buckets" from source "EnvSettingsSource"': a list or dict value
        found = re.search(r'field "(\w+)"', str(error))
        if found and found.group(1) in Settings.model_fields:
            field = found.group(1)
            return BadSetting(f"{variable(field)}: not a JSON value of type {Settings.model_fields[field].annotation} (e.g. [64,128,256,512])")
    return None


def read_settings(env_file: str | None = None) -> Settings:
    """The settings from the environment (and ``env_file`` under it); a value they cannot take raises BadSetting."""
    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    try:
        return Settings(_env_file=env_file) if env_file else Settings()
    except (ValidationError, SettingsError) as exc:
        bad = bad_setting(exc)
        if bad is None:
            raise
        raise BadSetting(f"{bad} (read from the environment and {ENV_FILE_VARIABLE}={env_file})" if env_file else str(bad)) from None


SERVING_FILE = "serving.env"
"""In a prepared model's gateway/: the ``KEYRANK_*=value`` lines its model is best served with (``keyrank finetune``
measures the readers of a fine-tuned scorer on dev and writes the best one's; `keyrank prepare` copies them from the
checkpoint folder). Below the environment, the env file and the command line: a setting given there wins."""
SERVING_WARNING = "# warning: "
"""A ``SERVING_FILE`` comment that `keyrank serve` and the gateway repeat when they start: ``keyrank finetune``
writes one when no reader of the new scorer beats the starting scorer on dev."""
SERVABLE_FROM_MODEL = frozenset({"default_strategy", "default_selector", "keyb2_blocks_length_bias"})
"""The settings a model folder's ``SERVING_FILE`` may set: how requests that name none are read, and how its scorer's
keyb2-blocks inputs are weighed by length."""


def serving_defaults(settings: Settings, given: Collection[str] = ()) -> tuple[Settings, dict[str, str]]:
    """``settings`` with what its model folder's ``SERVING_FILE`` says, for every setting not in ``given`` (those set
    by the environment, the env file or a flag), and what was taken from it. A line it may not set, or a value
    the setting cannot take, raises BadSetting naming the file."""
    if settings.models:  # several folders: each request's model is read as its folder serves it, no default to set
        return settings, {}
    path = settings.gateway_dir / SERVING_FILE
    if not path.is_file():
        return settings, {}
    taken: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        field = key.strip().removeprefix(ENV_PREFIX).lower()
        if not key.strip().startswith(ENV_PREFIX) or field not in SERVABLE_FROM_MODEL:
            raise BadSetting(f"{path}:{number}: {key.strip()!r} is not a setting a model folder sets "
                             f"(only {', '.join(sorted(variable(f) for f in SERVABLE_FROM_MODEL))})")
        if field not in given:
            taken[field] = value.strip()
    try:
        return settings.with_overrides(**taken), taken
    except ValueError as exc:
        raise BadSetting(f"{path}: {bad_setting(exc) or exc}") from None


def serving_warnings(settings: Settings) -> list[str]:
    """The ``SERVING_WARNING`` lines of the ``SERVING_FILE`` of the folder ``settings`` serve, each after the file's
    path."""
    path = settings.gateway_dir / SERVING_FILE
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [f"{path}: {line.removeprefix(SERVING_WARNING).strip()}" for line in lines if line.startswith(SERVING_WARNING)]


def environment_settings() -> Settings:
    """The settings the environment and ``KEYRANK_ENV_FILE`` give, before any model folder's ``SERVING_FILE``: their ``model_fields_set`` is what the user set. Raises BadSetting, naming the variable, for a
    value that does not parse or a ``KEYRANK_ENV_FILE`` that is not a file."""
    env_file = os.environ.get(ENV_FILE_VARIABLE)
    if env_file and not Path(env_file).is_file():
        raise BadSetting(f"{ENV_FILE_VARIABLE}={env_file}: no such file (a file of KEYRANK_*=value lines, e.g. `keyrank tune`'s keyrank.env)")
    return read_settings(env_file or None)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """This process's settings (read once): the environment over ``KEYRANK_ENV_FILE`` over the model folder's
    ``SERVING_FILE`` over the defaults. Raises BadSetting as ``environment_settings`` does."""
    settings = environment_settings()
    return serving_defaults(settings, settings.model_fields_set)[0]