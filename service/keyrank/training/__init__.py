"""``keyrank finetune``: train the scorer (and PARADE's aggregators) on exactly what serving reads.

Model inputs come from ``keyrank.pipeline.Pipeline.plan`` of the model being
trained, the same call the server makes, so a training sequence and the served
sequence for the same query and document are the same ids and token types.
The judged queries (TREC files, the constructions evaluation reports on) and the fixed
splits come from ``keyrank.data``.

    splits.py   the training sets on the training side of keyrank.data's fixed splits
    planned.py  candidate groups planned by the serving pipeline; sampled training groups
    model.py    the HF model behind the export's own wrapper; document scores per strategy
    losses.py   pairwise hinge (KeyB), listwise softmax CE, distillation
    cache.py    teacher MaxP scores and frozen pooled vectors, computed once, kept on disk
    recipe.py   FinetuneConfig (every knob, with its default) and the data it loads
    run.py      one run's state between its stages (models, pipeline, caches, scoring, dev metric) and its result
    state.py    the resumable checkpoint (weights, optimizer, schedule, RNG, the typed position)
    outputs.py  what a run leaves: the checkpoint, the trained aggregator or head, training.json
    loop.py     finetune, step by step: plan, fill the caches, train each epoch (seeded, resumable), check, write
    parade.py   PARADE-Attn / PARADE-Transformer modules and their ONNX export
    cli.py      the command line
"""

from __future__ import annotations


def finetune(*args, **kwargs):
    """See ``keyrank.training.loop.finetune`` (imported lazily: torch loads only when training)."""
    from keyrank.training.loop import finetune as run

    return run(*args, **kwargs)
