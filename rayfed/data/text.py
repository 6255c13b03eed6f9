"""AG News from its standard CSV files, with a deterministic tokenizer and vocabulary.

AG News (Zhang, Zhao and LeCun, "Character-level Convolutional Networks for Text
Classification", NeurIPS 2015, arXiv:1509.01626) has 120,000 training and 7,600 test news
articles in 4 classes (World, Sports, Business, Sci/Tech). Its files, as distributed in
``ag_news_csv.tar.gz``, are read from::

    <data.root>/ag_news_csv/train.csv
    <data.root>/ag_news_csv/test.csv

(an ``ag_news_csv.tar.gz`` found in ``data.root`` is extracted there, offline). Every row is
``"class index","title","description"`` with class index 1-4 and no header line; a text is
its title and description joined by a space, and its label the class index minus 1. Nothing
is downloaded: rayfed cannot fetch AG News, and a missing file raises
:class:`~rayfed.util.errors.DatasetError` naming it.

Text to token ids, deterministically (same files and options, same arrays):

* :func:`tokenize`: AG News' escapes undone (``\\`` line breaks, ``#39;``-style
  entities), lower-cased, split into words (runs of letters and digits, with inner
  apostrophes) and single punctuation marks;
* :func:`build_vocabulary`: from the **training split only**: ``<pad>`` (id 0),
  ``<unk>`` (id 1), then the tokens seen at least ``min_freq`` times, most frequent first,
  ties in code-point order, at most ``max_vocab`` entries in all;
* :func:`encode`: the first ``max_len`` ids of each text, unknown tokens as ``<unk>``,
  padded with ``<pad>`` to ``max_len``.

As for the image datasets, the test split is tokenised with the training split's
vocabulary and merged into the pool (``merge_splits=True``, PFLlib's generators) before
partitioning. The vocabulary rides in :attr:`ArrayDataset.vocabulary` and the engine saves it
in the run directory (:func:`save_vocabulary`), so the ids of a run can always be read back.
"""

from __future__ import annotations

import csv
import html
import logging
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from rayfed.data.archives import extract_tar
from rayfed.data.dataset import ArrayDataset
from rayfed.data.registry import DATASETS
from rayfed.data.torchvision_data import require_root
from rayfed.util.errors import DatasetError
from rayfed.util.files import atomic_write
from rayfed.util.validation import check_int

__all__ = [
    "AG_NEWS_CLASSES",
    "PAD",
    "UNK",
    "VOCABULARY_FILE",
    "build_vocabulary",
    "encode",
    "load_ag_news",
    "read_ag_news_csv",
    "save_vocabulary",
    "tokenize",
]

logger = logging.getLogger(__name__)

PAD, UNK = "<pad>", "<unk>"
"""The two special tokens, ids 0 and 1 of every vocabulary."""
VOCABULARY_FILE = "vocabulary.txt"
"""The run directory's vocabulary: one token per line, line i (from 0) is id i."""
AG_NEWS_CLASSES = ("World", "Sports", "Business", "Sci/Tech")
"""AG News' classes, in the order of its class index 1-4 (labels 0-3 here)."""
_AG_FOLDER = "ag_news_csv"
_AG_ARCHIVE = "ag_news_csv.tar.gz"
_AG_FILES = ("train.csv", "test.csv")
_OPTIONS = "data.options"

_ENTITY = re.compile(r"(?<!&)#(\d+);")  # AG News writes "&#39;" as "#39;"
# ... and "&quot;" as "quot;", glued to the quoted word at its end; "amp;", "lt;" and "gt;" only as
# words of their own (a word may end in "amp;" or "lt;": "camp;", "belt;").
_NAMED = re.compile(r"(?<!&)quot;|(?<![&\w])(?:amp|lt|gt);")
_TOKEN = re.compile(r"[^\W_]+(?:'[^\W_]+)*|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into lower-case words and punctuation marks (see the module docstring).

    >>> tokenize("Bears Claw Back (Reuters) - it#39;s \\\\ 3.5%")
    ['bears', 'claw', 'back', '(', 'reuters', ')', '-', "it's", '3', '.', '5', '%']
    """
    text = text.replace("\\", " ")
    text = html.unescape(_NAMED.sub(lambda match: "&" + match.group(0), _ENTITY.sub(r"&#\1;", text)))
    return _TOKEN.findall(text.lower())


def build_vocabulary(texts: Iterable[Sequence[str]], *, max_vocab: int, min_freq: int = 1) -> tuple[str, ...]:
    """``(<pad>, <unk>, tokens...)``: tokens seen ``min_freq`` times or more, most frequent first,
    ties in code-point order, capped at ``max_vocab`` entries in all (specials included).

    >>> build_vocabulary([["b", "a", "c"], ["a", "b"]], max_vocab=4)
    ('<pad>', '<unk>', 'a', 'b')
    """
    counts = Counter(token for tokens in texts for token in tokens)
    counts.pop(PAD, None)
    counts.pop(UNK, None)
    ranked = sorted((token for token, n in counts.items() if n >= min_freq), key=lambda t: (-counts[t], t))
    return (PAD, UNK, *ranked[: max(0, max_vocab - 2)])


def encode(texts: Sequence[Sequence[str]], vocabulary: Sequence[str], max_len: int) -> np.ndarray:
    """int32 (N, max_len): each text's first ``max_len`` token ids, ``<unk>`` (1) for unknown
    tokens, padded with ``<pad>`` (0).

    >>> encode([["a", "zz"], ["b", "a", "b"]], ("<pad>", "<unk>", "a", "b"), 2).tolist()
    [[2, 1], [3, 2]]
    """
    index = {token: i for i, token in enumerate(vocabulary)}
    unk = index[UNK]
    ids = np.zeros((len(texts), max_len), dtype=np.int32)
    for row, tokens in enumerate(texts):
        kept = [index.get(token, unk) for token in tokens[:max_len]]
        ids[row, : len(kept)] = kept
    return ids


def read_ag_news_csv(path: Path, num_classes: int = len(AG_NEWS_CLASSES)) -> tuple[np.ndarray, list[str]]:
    """(labels 0..K-1, texts) of an AG News CSV file; a malformed row raises DatasetError naming file and line."""
    labels: list[int] = []
    texts: list[str] = []
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.reader(fh)
            for row in reader:
                if len(row) < 2 or not row[0].strip().isdigit() or not 1 <= int(row[0]) <= num_classes:
                    raise DatasetError(
                        f"dataset 'ag_news': {str(path)!r} line {reader.line_num}: expected "
                        f'"class index (1-{num_classes})","title","description", but got {row[:3]!r}'
                    )
                labels.append(int(row[0]) - 1)
                texts.append(" ".join(row[1:]))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DatasetError(f"dataset 'ag_news': cannot read {str(path)!r} ({error})") from error
    return np.asarray(labels, dtype=np.int64), texts


@DATASETS.register("ag_news")
def load_ag_news(
    root: str | None,
    *,
    download: bool = False,
    seed: int = 0,
    merge_splits: bool = True,
    max_len: int = 200,
    max_vocab: int = 32_000,
    min_freq: int = 1,
) -> ArrayDataset:
    """AG News as token ids: 127,600 texts merged (120,000 with ``merge_splits=False``), 4 classes.

    Parameters
    ----------
    merge_splits
        Append the test split to the training split (PFLlib's generators do).
    max_len
        L, the fixed sequence length: longer texts are cut, shorter ones padded (PFLlib: 200).
    max_vocab
        The vocabulary's size cap, ``<pad>`` and ``<unk>`` included (PFLlib: 32,000).
    min_freq
        Training-split occurrences a token needs to enter the vocabulary.
    """
    del seed
    check_int(f"{_OPTIONS}.max_len", max_len, low=1)
    check_int(f"{_OPTIONS}.max_vocab", max_vocab, low=3)
    check_int(f"{_OPTIONS}.min_freq", min_freq, low=1)
    folder = _ag_news_folder(root, download)
    train_labels, train_texts = read_ag_news_csv(folder / "train.csv")
    train_tokens = [tokenize(text) for text in train_texts]
    vocabulary = build_vocabulary(train_tokens, max_vocab=max_vocab, min_freq=min_freq)
    ids, labels = [encode(train_tokens, vocabulary, max_len)], [train_labels]
    if merge_splits:
        test_labels, test_texts = read_ag_news_csv(folder / "test.csv")
        ids.append(encode([tokenize(text) for text in test_texts], vocabulary, max_len))
        labels.append(test_labels)
    logger.info("ag_news: vocabulary of %d tokens from %d training texts", len(vocabulary), len(train_texts))
    return ArrayDataset(
        "ag_news",
        np.ascontiguousarray(np.concatenate(ids)),
        np.concatenate(labels),
        len(AG_NEWS_CLASSES),
        vocabulary=vocabulary,
    )


def _ag_news_folder(root: str | None, download: bool) -> Path:
    """``<root>/ag_news_csv`` with both CSV files, extracting ``ag_news_csv.tar.gz`` if that is what is there."""
    base = require_root("ag_news", root)
    folder = base / _AG_FOLDER

    def missing() -> list[str]:
        return [f"{_AG_FOLDER}/{name}" for name in _AG_FILES if not (folder / name).is_file()]

    if missing() and (base / _AG_ARCHIVE).is_file():
        wanted = {f"{_AG_FOLDER}/{name}" for name in _AG_FILES}
        extract_tar("ag_news", base / _AG_ARCHIVE, base, wanted.__contains__)
    if missing():
        raise DatasetError(
            f"dataset 'ag_news': files missing under root {str(base)!r}: {', '.join(missing())}. rayfed cannot "
            f"download AG News{' (data.download=true does not help)' if download else ''}; put {_AG_ARCHIVE} or "
            f'its {_AG_FOLDER}/ folder (train.csv and test.csv, rows "class index","title","description") '
            f"into {str(base)!r}"
        )
    return folder


def save_vocabulary(run_dir: Path, dataset: ArrayDataset) -> None:
    """Write the dataset's vocabulary to ``run_dir/vocabulary.txt``, or check the one there.

    Nothing happens for a dataset without a vocabulary (images). A run that continues in
    ``run_dir`` must find the same vocabulary: different files under ``data.root`` would
    give its token ids other meanings, so that raises DatasetError.
    """
    if not dataset.vocabulary:
        return
    path = Path(run_dir) / VOCABULARY_FILE
    text = "\n".join(dataset.vocabulary) + "\n"
    if path.is_file():
        if path.read_text(encoding="utf-8") != text:
            raise DatasetError(
                f"dataset {dataset.name!r}: the vocabulary built from data.root differs from the run's "
                f"{str(path)!r}, so the data files changed since the run started; restore them or start a new run"
            )
        return
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
