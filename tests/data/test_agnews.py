"""AG News from its CSV files, the tokenizer and vocabulary, and text clients through the engine (offline)."""

from __future__ import annotations

import csv
import random
import tarfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from rayfed import RunConfig
from rayfed.data import ArrayDataset, load_dataset, model_inputs, save_vocabulary
from rayfed.data.text import VOCABULARY_FILE, build_vocabulary, encode, tokenize
from rayfed.engine import Simulation
from rayfed.engine.sizing import estimate_memory
from rayfed.models import build_model
from rayfed.util.errors import ConfigError, DatasetError
from tests.conftest import tiny_overrides

_TOPICS = {
    1: "war election minister troops peace treaty",
    2: "match goal team coach season league",
    3: "stock market shares profit bank deal",
    4: "software chip internet computer science space",
}
_FILLER = "the a of to in on for".split()


def _write_csv(path: Path, rows: list[tuple[object, str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh, quoting=csv.QUOTE_ALL).writerows(rows)


def _topic_rows(n: int, seed: int) -> list[tuple[object, str, str]]:
    """``n`` texts, classes 1-4 in turn, drawn from each class's topic words and shared filler words."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = i % 4 + 1
        words = _TOPICS[label].split() + _FILLER
        rows.append(
            (
                label,
                " ".join(rng.choice(words) for _ in range(3)).title(),
                " ".join(rng.choice(words) for _ in range(10)),
            )
        )
    return rows


def _write_ag_news(root: Path, train: int = 400, test: int = 80) -> Path:
    _write_csv(root / "ag_news_csv" / "train.csv", _topic_rows(train, 0))
    _write_csv(root / "ag_news_csv" / "test.csv", _topic_rows(test, 1))
    return root


# --- tokenizer and vocabulary ---------------------------------------------------------------------


def test_tokenizer_undoes_ag_news_escapes_and_splits_words_and_punctuation() -> None:
    # Execute
    tokens = tokenize("U.S. Stocks Fall \\ Oil at $50 (Reuters) - it#39;s quot;badquot; &lt;b&gt;")

    # Assert
    assert tokens == [
        "u",
        ".",
        "s",
        ".",
        "stocks",
        "fall",
        "oil",
        "at",
        "$",
        "50",
        "(",
        "reuters",
        ")",
        "-",
        "it's",
        '"',
        "bad",
        '"',
        "<",
        "b",
        ">",
    ]


def test_vocabulary_is_sorted_by_frequency_then_token_and_capped() -> None:
    # Prepare: b x3, a x2, c x2, d x1.
    texts = [["b", "c", "a"], ["b", "a", "d"], ["c", "b"]]

    # Execute
    full = build_vocabulary(texts, max_vocab=100)
    capped = build_vocabulary(texts, max_vocab=4)
    frequent = build_vocabulary(texts, max_vocab=100, min_freq=2)

    # Assert: the direct ranking (-count, token) after the two specials.
    counts = {"a": 2, "b": 3, "c": 2, "d": 1}
    assert full == ("<pad>", "<unk>", *sorted(counts, key=lambda t: (-counts[t], t)))
    assert full == ("<pad>", "<unk>", "b", "a", "c", "d")
    assert capped == ("<pad>", "<unk>", "b", "a")
    assert frequent == ("<pad>", "<unk>", "b", "a", "c")
    assert build_vocabulary(list(reversed(texts)), max_vocab=100) == full  # order of texts is irrelevant


def test_encode_truncates_pads_and_maps_unknown_tokens() -> None:
    # Execute
    ids = encode([["x", "a"], ["b", "a", "b", "a"], []], ("<pad>", "<unk>", "a", "b"), 3)

    # Assert
    assert ids.dtype == np.int32
    np.testing.assert_array_equal(ids, [[1, 2, 0], [3, 2, 3], [0, 0, 0]])


# --- the loader ---------------------------------------------------------------------------------


def test_loader_builds_the_vocabulary_from_the_training_split_only(tmp_path) -> None:
    # Prepare: the test split has a word the training split never uses.
    _write_csv(tmp_path / "ag_news_csv" / "train.csv", [(1, "Alpha beta", "beta gamma"), (3, "Gamma", "beta")])
    _write_csv(tmp_path / "ag_news_csv" / "test.csv", [(4, "Zeta", "alpha")])

    # Execute
    ds = load_dataset("ag_news", str(tmp_path), options={"max_len": 4})
    train_only = load_dataset("ag_news", str(tmp_path), options={"max_len": 4, "merge_splits": False})

    # Assert: counts beta 3, gamma 2, alpha 1; "zeta" is unknown (id 1); title then description.
    assert ds.kind == "tokens" and ds.input_shape == (4, 5) and ds.num_classes == 4
    assert ds.vocabulary == ("<pad>", "<unk>", "beta", "gamma", "alpha")
    np.testing.assert_array_equal(ds.inputs, [[4, 2, 2, 3], [3, 2, 0, 0], [1, 4, 0, 0]])
    np.testing.assert_array_equal(ds.labels, [0, 2, 3])
    assert len(train_only) == 2 and train_only.vocabulary == ds.vocabulary


def test_loader_is_deterministic_and_extracts_the_tar_archive_offline(tmp_path) -> None:
    # Prepare: the files only inside ag_news_csv.tar.gz, as distributed.
    source = _write_ag_news(tmp_path / "src", train=40, test=8)
    root = tmp_path / "root"
    root.mkdir()
    with tarfile.open(root / "ag_news_csv.tar.gz", "w:gz") as archive:
        archive.add(source / "ag_news_csv", arcname="ag_news_csv")

    # Execute
    first = load_dataset("ag_news", str(root), options={"max_len": 8, "max_vocab": 12})
    second = load_dataset("ag_news", str(source), options={"max_len": 8, "max_vocab": 12})

    # Assert
    assert (root / "ag_news_csv" / "train.csv").is_file()
    assert len(first) == 48 and len(first.vocabulary) == 12 and first.inputs.shape == (48, 8)
    np.testing.assert_array_equal(first.inputs, second.inputs)
    assert first.vocabulary == second.vocabulary


def test_missing_csv_files_are_named_with_the_layout(tmp_path) -> None:
    # Prepare
    _write_csv(tmp_path / "ag_news_csv" / "train.csv", [(1, "a", "b")])

    # Execute / Assert
    with pytest.raises(DatasetError, match="ag_news_csv/test.csv") as error:
        load_dataset("ag_news", str(tmp_path))
    assert "ag_news_csv/train.csv" not in str(error.value) and "class index" in str(error.value)
    with pytest.raises(ConfigError, match="data.root"):
        load_dataset("ag_news", None)


def test_a_bad_class_index_names_the_file_and_line(tmp_path) -> None:
    # Prepare: classes are 1-4.
    _write_csv(tmp_path / "ag_news_csv" / "train.csv", [(1, "a", "b"), (5, "c", "d")])
    _write_csv(tmp_path / "ag_news_csv" / "test.csv", [(1, "a", "b")])

    # Execute / Assert
    with pytest.raises(DatasetError, match=r"train\.csv' line 2: expected \"class index \(1-4\)\""):
        load_dataset("ag_news", str(tmp_path))


def test_bad_options_name_the_field(tmp_path) -> None:
    # Execute / Assert
    with pytest.raises(ConfigError, match="data.options.max_len"):
        load_dataset("ag_news", str(tmp_path), options={"max_len": 0})


def test_token_datasets_check_ids_against_the_vocabulary() -> None:
    # Execute / Assert
    with pytest.raises(DatasetError, match=r"token ids must lie in \[0, 3\)"):
        ArrayDataset("t", np.array([[0, 3]], np.int32), np.zeros(1, np.int64), 2, vocabulary=("<pad>", "<unk>", "a"))
    with pytest.raises(DatasetError, match="not normalised"):
        ArrayDataset("t", np.zeros((1, 2), np.int32), np.zeros(1, np.int64), 2, (0.5,), (0.5,), ("<pad>", "<unk>"))


def test_token_batches_become_int64_ids_and_feed_the_text_model() -> None:
    # Prepare
    batch = np.array([[3, 2, 0, 0], [1, 0, 0, 0]], dtype=np.int32)
    batch.setflags(write=False)  # as Ray's object store hands arrays out
    torch.manual_seed(0)
    model = build_model("fasttext", (4, 5), 4)

    # Execute
    ids = model_inputs(batch)
    logits = model(ids)

    # Assert: the masked mean of the non-padding embeddings, through hidden and fc.
    assert ids.dtype == torch.int64 and ids.tolist() == batch.tolist()
    emb = model.embedding.weight
    means = torch.stack([(emb[3] + emb[2]) / 2, emb[1]])
    torch.testing.assert_close(logits, model.fc(model.hidden(means)))


def test_image_models_refuse_token_sequences_naming_the_text_models() -> None:
    # Execute / Assert
    with pytest.raises(ConfigError, match=r"takes images \(C, H, W\).*token sequences.*fasttext"):
        build_model("cnn4", (200, 32_000), 4)


def test_memory_estimate_counts_int32_token_ids(tmp_path) -> None:
    # Prepare
    config = RunConfig().override(
        tiny_overrides(
            tmp_path / "run",
            **{
                "data.dataset": "ag_news",
                "data.root": str(tmp_path),
                "data.options": {"max_len": 50},
                "model.name": "fasttext",
            },
        )
    )

    # Execute
    dataset = next(part for part in estimate_memory(config).parts if part.name == "dataset")

    # Assert: 127,600 texts of 50 int32 ids and an int64 label.
    assert dataset.bytes == 127_600 * (4 * 50 + 8)


# --- text clients through the engine ------------------------------------------------------------------


def _text_run(tmp_path: Path, name: str, **extra: object) -> RunConfig:
    return RunConfig().override(
        tiny_overrides(
            tmp_path / name,
            **{
                "data.dataset": "ag_news",
                "data.root": str(tmp_path / "data"),
                "data.options": {"max_len": 16},
                "model.name": "fasttext",
                "algorithm.name": "fedavg",
                "data.partition": "dirichlet",
                "data.alpha": 1.0,
                "data.num_clients": 6,
                "train.rounds": 2,
                "train.lr": 0.5,
                "train.local_epochs": 2,
                **extra,
            },
        )
    )


def test_text_clients_learn_through_dirichlet_and_fedavg_and_the_run_keeps_its_vocabulary(tmp_path) -> None:
    # Prepare: 480 texts of 4 topics over 6 clients.
    _write_ag_news(tmp_path / "data")
    config = _text_run(tmp_path, "run")

    # Execute
    result = Simulation(config).run()

    # Assert: well above chance (0.25) after two rounds; the vocabulary is saved with the run.
    assert result.history[-1]["accuracy"] > 0.8
    dataset = load_dataset("ag_news", str(tmp_path / "data"), options={"max_len": 16})
    saved = (tmp_path / "run" / VOCABULARY_FILE).read_text(encoding="utf-8").splitlines()
    assert tuple(saved) == dataset.vocabulary
    # Bytes: every client receives the whole model, V*D + (D*D + D) + (D*K + K) floats of 4 bytes.
    num_params = len(dataset.vocabulary) * 32 + (32 * 32 + 32) + (32 * 4 + 4)
    clients = pq.read_table(tmp_path / "run" / "clients").to_pylist()
    assert {c["bytes_down"] for c in clients if c["sampled"]} == {4 * num_params}


def test_stacked_training_of_text_clients_matches_one_at_a_time(tmp_path) -> None:
    # Prepare
    _write_ag_news(tmp_path / "data", train=200, test=40)

    # Execute: vmap over the clients' embeddings against the plain loop, half the clients per round.
    stacked = Simulation(_text_run(tmp_path, "on", **{"engine.vectorize": "on", "engine.join_ratio": 0.5})).run()
    plain = Simulation(_text_run(tmp_path, "off", **{"engine.vectorize": "off", "engine.join_ratio": 0.5})).run()

    # Assert
    for a, b in zip(stacked.history, plain.history):
        assert a["num_sampled"] == 3
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=1e-9)
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-4)


def test_a_run_refuses_to_continue_on_a_different_vocabulary(tmp_path) -> None:
    # Prepare: a run directory whose vocabulary.txt came from other data.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / VOCABULARY_FILE).write_text("<pad>\n<unk>\nother\n", encoding="utf-8")
    ds = ArrayDataset("t", np.zeros((1, 2), np.int32), np.zeros(1, np.int64), 2, vocabulary=("<pad>", "<unk>", "x"))

    # Execute / Assert
    with pytest.raises(DatasetError, match="data files changed"):
        save_vocabulary(tmp_path / "run", ds)
    save_vocabulary(tmp_path / "same", ds)
    save_vocabulary(tmp_path / "same", ds)  # the same vocabulary again: accepted
    assert (tmp_path / "same" / VOCABULARY_FILE).read_text(encoding="utf-8") == "<pad>\n<unk>\nx\n"
