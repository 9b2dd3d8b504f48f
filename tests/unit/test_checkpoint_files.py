"""Checkpoint files on disk: round trip, keep-K, damage detection, atomicity, export."""

import json
import logging

import numpy as np
import pytest
from safetensors.numpy import load_file

from shoal.train.checkpoint import (CheckpointError, export_model, list_checkpoints, load_latest_checkpoint,
                                    read_checkpoint, save_checkpoint)

ADAM = {"name": "adam", "learning_rate": 0.001, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}


def _model(seed):
    rng = np.random.default_rng(seed)
    variables = {"layer.0.weight": rng.normal(size=(6, 4)).astype(np.float32), "b": np.float32(seed) * np.ones(4, np.float32)}
    slots = {name: {"m": rng.normal(size=v.shape).astype(np.float32), "v": rng.random(v.shape).astype(np.float32),
                    "t": np.array(seed, np.int64)} for name, v in variables.items()}
    return variables, slots


def _save(tmp_path, step, keep=5):
    variables, slots = _model(step)
    return save_checkpoint(tmp_path, step, variables, slots, optimizer=ADAM, mode="sync:2", keep=keep)


def test_round_trip_keeps_values_optimizer_state_and_step(tmp_path):
    variables, slots = _model(7)
    save_checkpoint(tmp_path, 7, variables, slots, optimizer=ADAM, mode="async",
                    layout={"b": [{"name": "b", "ps": 1, "start": 0, "stop": 4}]})
    got = load_latest_checkpoint(tmp_path)
    assert got.step == 7 and got.optimizer == ADAM and got.manifest["mode"] == "async"
    assert got.manifest["variables"]["b"]["shards"] == [{"name": "b", "ps": 1, "start": 0, "stop": 4}]
    for name, value in variables.items():
        np.testing.assert_array_equal(got.variables[name], value)
        assert set(got.slots[name]) == {"m", "v", "t"}
        for slot, want in slots[name].items():
            np.testing.assert_array_equal(got.slots[name][slot], want)
            assert got.slots[name][slot].shape == want.shape  # the scalar step count stays 0-d


def test_only_the_newest_k_checkpoints_are_kept(tmp_path):
    for step in (10, 20, 30, 40):
        _save(tmp_path, step, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-0000000030", "ckpt-0000000040"]


def test_corrupt_newest_checkpoint_is_skipped_with_a_warning_and_the_previous_used(tmp_path, caplog):
    _save(tmp_path, 10)
    newest = _save(tmp_path, 20)
    data = bytearray((newest / "variables.safetensors").read_bytes())
    data[-3] ^= 0xFF  # flip bits in a tensor: still valid safetensors, wrong values
    (newest / "variables.safetensors").write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="shoal.train.checkpoint"):
        got = load_latest_checkpoint(tmp_path)
    assert got.step == 10
    assert "ckpt-0000000020" in caplog.text and "sha256" in caplog.text


def test_partial_checkpoint_without_manifest_is_skipped(tmp_path, caplog):
    _save(tmp_path, 10)
    newest = _save(tmp_path, 20)
    (newest / "manifest.json").unlink()  # e.g. copied by hand and cut short
    with caplog.at_level(logging.WARNING):
        assert load_latest_checkpoint(tmp_path).step == 10
    assert "manifest" in caplog.text


def test_interrupted_save_leaves_no_visible_checkpoint(tmp_path, monkeypatch):
    _save(tmp_path, 10)
    variables, slots = _model(20)
    monkeypatch.setattr("shoal.train.checkpoint._fsync_dir", lambda path: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, 20, variables, slots, optimizer=ADAM, mode="async")
    monkeypatch.undo()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-0000000010"]
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_saving_the_same_step_again_replaces_it(tmp_path):
    _save(tmp_path, 10)
    variables, slots = _model(99)
    save_checkpoint(tmp_path, 10, variables, slots, optimizer=ADAM, mode="async")
    got = read_checkpoint(list_checkpoints(tmp_path)[-1])
    np.testing.assert_array_equal(got.variables["b"], variables["b"])
    assert len(list_checkpoints(tmp_path)) == 1


def test_manifest_of_another_format_is_refused(tmp_path):
    path = _save(tmp_path, 10)
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps(dict(manifest, version=99)))
    with pytest.raises(CheckpointError, match="version 99"):
        read_checkpoint(path)


def test_no_checkpoint_gives_none(tmp_path):
    assert load_latest_checkpoint(tmp_path / "missing") is None


def test_export_is_plain_safetensors_with_the_models_names(tmp_path):
    variables, _ = _model(3)
    path = export_model(tmp_path / "export" / "model.safetensors", variables, step=3)
    loaded = load_file(path)
    assert loaded.keys() == variables.keys()
    np.testing.assert_array_equal(loaded["layer.0.weight"], variables["layer.0.weight"])
