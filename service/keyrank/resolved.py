"""Stage 0 of every request: what it asked for (``RerankOptions``), decided once (``Resolved``).

A request names a strategy, a selector and some caps, or leaves them to the
service. ``resolve`` fills the defaults, refuses unknown names and options out
of range, checks that the model has what the strategy and the selector need,
and settles the caps; everything after it (admission's cost estimate,
``Reranker.arank``, ``Pipeline.cut``, training's plans) reads the one
``Resolved`` it returns instead of deciding again, so what admission charges
is what the pipeline cuts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from keyrank.config import Settings
from keyrank.errors import InvalidRequest
from keyrank.names import SELECTORS, STRATEGIES
from keyrank.select import REGISTRY as SELECTORS_BY_NAME
from keyrank.select import SelectorSpec
from keyrank.strategies import REGISTRY, StrategySpec
from keyrank.template import InputTemplate


@dataclass(frozen=True, slots=True)
class RerankOptions:
    """How one request wants to be ranked; ``None`` = the service's default."""

    strategy: str | None = None
    """A registry name (strategies.REGISTRY)."""
    selector: str | None = None
    """Block selector for strategies that select (keyb2)."""
    top_n: int | None = None
    """Return only the best ``top_n`` documents."""
    max_tokens_per_doc: int | None = None
    """Read at most this many tokens of each document (the cut is reported)."""
    max_windows_per_doc: int | None = None
    """Windowed strategies: score at most this many windows per document (Cohere's max_chunks_per_doc);
    None = the service's cap. The cut is reported."""
    timeout_s: float | None = None
    """Deadline of this request in seconds."""


@dataclass(frozen=True, slots=True)
class Resolved:
    """One request's options, decided: the registry rows it runs and the caps it runs under."""

    spec: StrategySpec
    """The strategy's registry row (its cut and aggregation)."""
    selector: SelectorSpec | None
    """The block selector's registry row (strategies that select), else None."""
    top_n: int | None
    """Return only the best ``top_n`` documents (None: all)."""
    max_tokens_per_doc: int | None
    """Read at most this many tokens of each document (None: all)."""
    max_windows: int
    """Windows per document at most: the request's cap within the service's (windowed strategies)."""
    window_picker: SelectorSpec | None
    """Windowed strategies with ``window_cap_by`` bm25: the selector whose best windows a document keeps past
    ``max_windows`` (in document order, ``segment.best_pieces``); None: the first ones are kept, or nothing is capped."""
    timeout_s: float
    """The request's deadline in seconds."""
    template: InputTemplate
    """The model's frame: how many document tokens fit next to a query."""
    settings: Settings
    """The stage parameters the request runs with."""

    @property
    def strategy(self) -> str:
        return self.spec.name

    @property
    def selector_name(self) -> str | None:
        return self.selector.name if self.selector else None

    def budget(self, query_tokens: int) -> int:
        """Document tokens that fit next to a query of ``query_tokens`` in one model input (the strategy's cut
        says how long an input may be: ``max_sequence_length``, or longp's own length)."""
        return self.template.document_budget(query_tokens, self.spec.cut.max_length(self.settings))


def resolve(options: RerankOptions, settings: Settings, template: InputTemplate, gateway_dir: Path | None) -> Resolved:
    """``options`` decided against the service's ``settings`` and the prepared model in ``gateway_dir``;
    ``InvalidRequest`` naming the field for anything that cannot run."""
    for name in ("top_n", "max_tokens_per_doc", "max_windows_per_doc"):
        value = getattr(options, name)
        if value is not None and value < 1:
            raise InvalidRequest(f"{name} must be at least 1", field=name)
    strategy = options.strategy or settings.default_strategy
    if strategy not in REGISTRY:
        raise InvalidRequest(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}", field="strategy")
    spec = REGISTRY[strategy]
    if refusal := spec.cut.refuses(template, settings):
        raise InvalidRequest(refusal, field="strategy")
    selector = None
    if spec.needs_selector:
        name = options.selector or settings.default_selector
        if name not in SELECTORS_BY_NAME:
            raise InvalidRequest(f"unknown selector {name!r}; expected one of {', '.join(SELECTORS)}", field="selector")
        selector = SELECTORS_BY_NAME[name]
        if selector.bi_encoder and (gateway_dir is None or not (gateway_dir / "bi_encoder").is_dir()):
            raise InvalidRequest(f"the {name} selector's bi-encoder was not prepared (keyrank prepare without --no-bi-encoder)",
                                 field="selector")
    missing = spec.missing_parts(gateway_dir)
    if missing:
        raise InvalidRequest(
            f"strategy {strategy!r} needs its trained part ({', '.join(missing)}); train it with "
            f"`keyrank finetune --strategy {strategy}` and prepare the model again", field="strategy"
        )
    if spec.least_passes > settings.keyb2_passes:  # the row's own fewest passes (keyb2-parade-*)
        settings = settings.model_copy(update={"keyb2_passes": spec.least_passes})
    cap = settings.max_windows_per_doc
    picker = settings.window_cap_by
    return Resolved(
        spec=spec,
        selector=selector,
        top_n=options.top_n,
        max_tokens_per_doc=options.max_tokens_per_doc,
        max_windows=min(options.max_windows_per_doc, cap) if options.max_windows_per_doc else cap,
        window_picker=SELECTORS_BY_NAME[picker] if spec.windowed and picker != "first" else None,
        timeout_s=options.timeout_s or settings.request_timeout_s,
        template=template,
        settings=settings,
    )


DEFAULT_SETTINGS = {"strategy": "default_strategy", "selector": "default_selector"}
"""The setting a request that names no strategy (no selector) takes its choice from, by the field a refusal names."""


def check_defaults(settings: Settings, template: InputTemplate, gateway_dir: Path | None, model: str) -> None:
    """The defaults a request takes when it names nothing, resolved once at start against ``model`` (the prepared model
    of ``template`` and ``gateway_dir``, named in the message): one this model cannot serve (longp on a 512-token
    model, a dense selector without its bi-encoder, a trained strategy not trained) is a ValueError naming the setting,
    raised before anything is served, instead of a 422 on every request that leaves the choice to the service."""
    try:
        resolve(RerankOptions(), settings, template, gateway_dir)
    except InvalidRequest as exc:
        setting = DEFAULT_SETTINGS.get(exc.field or "")
        if setting is None:
            raise
        variable = f"KEYRANK_{setting.upper()}"
        raise ValueError(f"{setting} ({variable}) is {getattr(settings, setting)!r}, which {model} cannot serve: {exc}. "
                         f"Set {variable} to one it can serve") from None
