"""``keyrank idf``: IDF tables for the bm25 selector (``KEYRANK_BM25_IDF=table|general``).

    keyrank idf --docs corpus.jsonl --out idf.json          # from your own collection
    keyrank idf --general --out service/keyrank/select/idf-general.json.gz   # the table keyrank ships

Both write ``{word piece: idf}`` (JSON; gzipped when the name ends in ``.gz``),
the format ``KEYRANK_BM25_IDF_TABLE`` reads, on the served model's tokenizer
(``--model-dir``, the output of ``keyrank prepare``) and its BM25 terms
(punctuation and special tokens are not terms).

- ``--docs``: one JSON object per line with a ``text`` (an ``id`` is allowed
  and ignored). IDF is scikit-learn's smoothed IDF over the documents, as
  KeyB2 computes it on its collection: ln((1 + N) / (1 + df)) + 1. Streamed in
  batches: memory is one batch plus a vocabulary-sized counter.
- ``--general``: word frequencies from ``wordfreq`` (English, its "large"
  list: Wikipedia, subtitles, news, books, web text, Reddit, Twitter; frozen
  since its 3.0 release, so the build is reproducible; data CC BY-SA 4.0).
  There are no documents in it, so document frequency is modelled: each word's
  frequency is spread over its word pieces (numbers: wordfreq's estimate for each
  vocabulary entry with digits), giving each piece a probability p
  per term; the chance it occurs in a CogLTX block of ``--block-terms`` terms
  is P = 1 - (1 - p)^L, and idf = ln(1 / P) + 1 (the smoothed IDF of a very
  large collection of such blocks). Nothing from the evaluation data is read.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

from keyrank.select.bm25 import smoothed_idf
from keyrank.tokenize import TextTokenizer

GENERAL_TABLE = Path(__file__).with_name("idf-general.json.gz")
"""Where ``--general`` writes by default: the table shipped as package data (``bm25.GENERAL_TABLE`` reads it)."""
GENERAL_BLOCK_TERMS = 63
"""L of the general table: a CogLTX block's size limit in tokens (``block_max_tokens``), the unit BM25 scores."""
BATCH = 256
"""Documents tokenized at once by ``--docs``."""


def read_texts(path: Path) -> Iterator[str]:
    """The ``text`` of each JSONL line (blank lines skipped); a line without one is an error naming it."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not JSON ({e.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f'{path}:{number}: expected an object with a string "text" (and optionally "id")')
            yield record["text"]


def _batches(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def corpus_idf(texts: Iterable[str], tokenizer: TextTokenizer, is_term: np.ndarray) -> tuple[dict[str, float], int]:
    """Smoothed IDF of every term that occurs in ``texts`` (each one document), and the number of documents."""
    df = np.zeros(tokenizer.vocab_size, dtype=np.int64)
    n_docs = 0
    for batch in _batches(texts, BATCH):
        for enc in tokenizer.encode_documents(batch):
            ids = enc.ids[is_term[enc.ids]]
            df[np.unique(ids)] += 1
            n_docs += 1
    if n_docs == 0:
        raise ValueError("no documents: the corpus is empty")
    seen = np.flatnonzero(df)
    idf = smoothed_idf(df[seen], n_docs)
    return {tokenizer.id_to_token(int(t)): round(float(v), 6) for t, v in zip(seen, idf)}, n_docs


def general_idf(tokenizer: TextTokenizer, is_term: np.ndarray, block_terms: int = GENERAL_BLOCK_TERMS) -> dict[str, float]:
    """The general table from ``wordfreq``'s English frequencies (see the module's docstring for the model)."""
    import wordfreq

    # wordfreq keeps numbers with their digits replaced by 0 ("1973" is counted as "0000"); those placeholders
    # are dropped, and each vocabulary entry with a digit gets wordfreq's own estimate for it instead.
    words = {w: f for w, f in wordfreq.get_frequency_dict("en", wordlist="large").items() if not any(c.isdigit() for c in w)}
    for token_id in np.flatnonzero(is_term):
        token = tokenizer.id_to_token(int(token_id)) or ""
        if not token.startswith("##") and any(c.isdigit() for c in token) and token not in words:
            words[token] = wordfreq.word_frequency(token, "en", wordlist="large")
    mass = np.zeros(tokenizer.vocab_size, dtype=np.float64)
    for batch in _batches(words, 4096):
        for word, enc in zip(batch, tokenizer.encode_documents(batch)):
            ids = enc.ids[is_term[enc.ids]]
            np.add.at(mass, ids, words[word])
    p = mass / mass.sum()  # probability of each piece at a term position
    seen = np.flatnonzero(p > 0)
    occurs = -np.expm1(block_terms * np.log1p(-p[seen]))  # 1 - (1 - p)^L, exact for tiny p
    idf = np.log(1.0 / occurs) + 1.0
    return {tokenizer.id_to_token(int(t)): round(float(v), 4) for t, v in zip(seen, idf)}


def write_table(table: dict[str, float], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(table, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()
    if out.suffix == ".gz":
        data = gzip.compress(data, mtime=0)  # mtime 0: the same input gives the same bytes
    out.write_bytes(data)


def parser() -> argparse.ArgumentParser:
    from keyrank.cli_format import DefaultsHelpFormatter

    p = argparse.ArgumentParser(prog="keyrank idf", description=__doc__.split("\n\n")[0], formatter_class=DefaultsHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--docs", type=Path, help='your collection: JSONL, one {"text": ...} (or {"id": ..., "text": ...}) per line '
                        "(this or --general is required)")
    source.add_argument("--general", action="store_true",
                        help="build the general table from wordfreq's English frequencies instead (this or --docs is required)")
    p.add_argument("--out", type=Path, default=None,
                   help=f"the table (JSON; gzipped if it ends in .gz); unset: with --general, {GENERAL_TABLE.name} in the package, "
                        "else required")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="output of `keyrank prepare` whose tokenizer is used; unset = KEYRANK_MODEL_DIR (models)")
    p.add_argument("--block-terms", type=int, default=GENERAL_BLOCK_TERMS, help="--general: terms per modelled block")
    return p


def tokenizer_of(model_dir: Path | None) -> tuple[TextTokenizer, np.ndarray]:
    """The served tokenizer and its term mask, exactly as the pipeline builds them."""
    from keyrank.config import get_settings
    from keyrank.errors import ModelAssetsMissing
    from keyrank.pipeline import Pipeline

    settings = get_settings()
    try:
        pipeline = Pipeline.from_model_dir(settings.with_overrides(model_dir=model_dir or settings.model_dir, document_cache_bytes=0))
    except ModelAssetsMissing as e:
        raise SystemExit(str(e)) from None
    return pipeline.tokenizer, pipeline.is_term


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.out is None:
        if not args.general:
            p.error("--out is required with --docs")
        args.out = GENERAL_TABLE
    tokenizer, is_term = tokenizer_of(args.model_dir)
    if args.general:
        table = general_idf(tokenizer, is_term, args.block_terms)
        what = f"wordfreq {metadata.version('wordfreq')} (en, large), L = {args.block_terms}"
    else:
        if not args.docs.exists():
            raise SystemExit(f"{args.docs} not found")
        try:
            table, n_docs = corpus_idf(read_texts(args.docs), tokenizer, is_term)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        what = f"{n_docs} documents"
    write_table(table, args.out)
    print(f"wrote {args.out}: {len(table)} terms from {what}", file=sys.stderr)
    return 0
