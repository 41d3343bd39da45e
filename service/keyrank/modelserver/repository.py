"""The repository the embedded Triton serves, and what it expects of a prepared one.

`keyrank prepare` (``keyrank.prepare.repositories``) writes each model folder by the
names below and copies the Python-backend code of ``python_models/`` beside the
weights. The server does not serve those folders themselves: at each start it
stages a repository in its private work dir, each model's config.pbtxt copied
(named for the model it is served as, without dynamic-batcher priority levels
an older prepare wrote) and its version folders' files linked.
Triton's Python backend stub runs Python isolated (PYTHONDONTWRITEBYTECODE does
not reach it) and compiles model.py into a ``__pycache__`` beside the path it
imported: through the links that is the work dir, never the model folder, which
may be a read-only volume. The same staging serves several prepared folders as
one repository (``keyrank serve`` with KEYRANK_MODELS), each model's interaction
graphs under names of their own (``served_models``).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from keyrank.config import served_graph_name

MODEL_NAME = "cross_encoder"
"""Name of the cross-encoder in every repository `keyrank prepare` writes."""
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
"""Input names, INT64 [N, L]; every exported model takes all three."""
GRAPH_SUFFIX = "-features"
"""Models named ``<kind>-features`` in a repository are interaction graphs (CEDR, Model 1: keyrank/interaction.py):
the same Python-backend model over their own ONNX file, with a fourth input, ``token_roles``; the embedded server
loads them beside the cross-encoder and watches them as it does the cross-encoder."""
GRAPH_INPUTS = INPUTS + ("token_roles",)
"""An interaction graph's inputs: the cross-encoder's three, then each token's role (0 frame and padding, 1 query,
2 document: ``InputTemplate.roles``)."""
PYTHON_MODELS = Path(__file__).resolve().parent / "python_models"
"""The Python-backend models `keyrank prepare` copies into a version folder (they run in Triton's stub)."""


PRIORITY_LEVEL_LINE = re.compile(r"^[ \t]*(priority_levels|default_priority_level)[ \t]*:[ \t]*\d+[ \t]*\n", re.MULTILINE)
"""A line of the dynamic batcher's priority settings, as `keyrank prepare` wrote them before."""


def without_priority_levels(config: str) -> str:
    """``config`` with its dynamic batcher reduced to one FIFO queue. With priority levels Triton's batcher
    could leave a request that arrived while the instance was busy queued for its 500 ms timeout after
    the instance went idle (prepare/repositories.py, above ``triton_config``); a folder prepared before
    that is served without them."""
    return PRIORITY_LEVEL_LINE.sub("", config)


def graph_folders(repository: Path) -> list[Path]:
    """The interaction graphs installed in a prepared repository folder (``keyrank finetune --install-into``)."""
    if not repository.is_dir():
        return []
    return sorted(p for p in repository.iterdir() if p.name.endswith(GRAPH_SUFFIX) and (p / "config.pbtxt").is_file())


def stage(repository: Path, models: dict[str, Path]) -> None:
    """``repository`` afresh, with ``repository/<name>`` for each ``name: prepared model folder``: its
    config.pbtxt with the name rewritten, its version folders' files as symlinks (no copy of the weights).
    Each folder must hold a config.pbtxt: the caller says which was not prepared."""
    shutil.rmtree(repository, ignore_errors=True)  # nothing stale from an earlier start survives
    for name, folder in models.items():
        config = (folder / "config.pbtxt").read_text()
        text = re.sub(r'^name: ".*"$', f'name: "{name}"', config, count=1, flags=re.MULTILINE)
        text = without_priority_levels(text)
        (repository / name).mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(text)
        for version in (p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()):
            (repository / name / version.name).mkdir()
            for file in version.iterdir():
                # A __pycache__ left there by an earlier server would take this one's bytecode back to the model.
                if file.name != "__pycache__":
                    (repository / name / version.name / file.name).symlink_to(file.resolve())


def served_models(served: dict[str, Path], variant: str) -> dict[str, Path]:
    """KEYRANK_MODELS' cross-encoders by their served names, each followed by its installed interaction graphs,
    named so that two models' graphs of one kind do not collide (``served_graph_name``)."""
    models: dict[str, Path] = {}
    for name, folder in served.items():
        root = Path(folder).resolve() / variant
        models[name] = root / MODEL_NAME
        models.update({served_graph_name(name, graph.name): graph for graph in graph_folders(root)})
    return models


def repository_models(root: Path, model: str) -> dict[str, Path]:
    """A repository folder's models by name: ``model`` (served; the embedded server names it if missing), then every
    other model folder in it (the interaction graphs among them), staged too so that the admin API loads them as it
    would from the folder itself."""
    others = sorted(p for p in root.iterdir() if p.is_dir() and p.name != model and (p / "config.pbtxt").is_file()) if root.is_dir() else []
    return {model: root / model, **{p.name: p for p in others}}
