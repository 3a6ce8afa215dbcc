"""Training data files and the resumable, seeded sample order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentlightning.config.schema import ConfigError
from agentlightning.trainer.data import DataCursor, load_files, load_samples

SAMPLES = [{"id": i} for i in range(10)]


def test_each_epoch_is_a_seeded_permutation() -> None:
    cursor = DataCursor(SAMPLES, total_epochs=3, shuffle=True, seed=7)
    epochs = [cursor.next(10) for _ in range(3)]
    assert cursor.exhausted and cursor.next(4) == []
    for epoch in epochs:
        assert sorted(s["id"] for s in epoch) == list(range(10))
    assert epochs[0] != epochs[1]  # a new order every epoch
    again = DataCursor(SAMPLES, total_epochs=3, shuffle=True, seed=7)
    assert again.next(30) == [s for e in epochs for s in e]
    assert DataCursor(SAMPLES, 1, shuffle=True, seed=8).next(10) != epochs[0]


def test_no_shuffle_keeps_file_order_and_batches_cross_epochs() -> None:
    cursor = DataCursor(SAMPLES, total_epochs=2, shuffle=False)
    assert [s["id"] for s in cursor.next(4)] == [0, 1, 2, 3]
    cursor.next(4)
    assert [s["id"] for s in cursor.next(4)] == [8, 9, 0, 1]
    assert cursor.epoch == 1


def test_resume_from_a_position_continues_the_same_order() -> None:
    full = DataCursor(SAMPLES, total_epochs=4, seed=3).next(40)
    first = DataCursor(SAMPLES, total_epochs=4, seed=3)
    first.next(13)
    resumed = DataCursor(SAMPLES, total_epochs=4, seed=3)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert resumed.next(27) == full[13:]


def test_resume_with_other_data_is_refused() -> None:
    cursor = DataCursor(SAMPLES, 1)
    with pytest.raises(ValueError, match=r"same data\.train_files"):
        cursor.load_state_dict({"position": 3, "n_samples": 11, "seed": 0})


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("a.jsonl", '{"id": 1}\nnot json\n', "line 2 is not valid JSON"),
        ("a.jsonl", "[1, 2]\n", "sample 0 of .* is a list, not an object"),
        ("a.jsonl", "\n\n", "holds no samples"),
        ("a.json", '{"id": 1}', "must hold a JSON list"),
        ("a.csv", "id\n1\n", "must end in .jsonl, .json or .parquet"),
    ],
)
def test_bad_files_say_what_is_wrong(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ConfigError, match=f"data.val_files: .*{message}"):
        load_samples(path, "data.val_files")


def test_files_are_read_in_order(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"id": 1}\n\n{"id": 2}\n')
    (tmp_path / "b.json").write_text('[{"id": 3}]')
    assert load_files([str(tmp_path / "a.jsonl"), str(tmp_path / "b.json")], "k") == [
        {"id": 1},
        {"id": 2},
        {"id": 3},
    ]
    assert load_files(None, "k") == []
    with pytest.raises(ConfigError, match=r"k: .* is not a file"):
        load_files(str(tmp_path / "missing.jsonl"), "k")
