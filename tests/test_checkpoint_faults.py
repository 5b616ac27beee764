"""Checkpointer under misuse and faults: inside a step, crashed saves, a corrupt pointer."""

import os

import pytest
import tensorflow as tf

import catalogue
import replicator


def _contents(directory):
  """Every file under `directory` with its bytes, to show that nothing changed."""
  found = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        found[os.path.relpath(path, directory)] = f.read()
  return found


def test_saving_inside_step_fn_is_an_error_and_writes_nothing(tmp_path):
  repl = catalogue.make("multi_gpu_2")
  with repl.context():
    counter = tf.Variable(0.0)
  checkpointer = replicator.Checkpointer(tmp_path, counter=counter)

  def step_fn():
    counter.assign_add(1.0)
    checkpointer.save(step=1)

  with pytest.raises(RuntimeError, match=r"save: called inside step_fn.*call "
                     r"checkpointer\.save\(step\) between repl\.run calls, outside step_fn"):
    repl.run(step_fn)
  assert not list(tmp_path.iterdir())
  assert float(counter) == 0.0


def test_reading_or_writing_checkpoints_inside_a_tf_function_is_an_error(tmp_path):
  counter = tf.Variable(1.0)
  checkpointer = replicator.Checkpointer(tmp_path, counter=counter)
  checkpointer.save(step=1)
  before = _contents(tmp_path)
  calls = {"save": lambda: checkpointer.save(step=2),
           "restore_latest": checkpointer.restore_latest,
           "latest_step": lambda: checkpointer.latest_step}
  for method, call in calls.items():
    with pytest.raises(RuntimeError, match=rf"{method}: called inside step_fn or a "
                       r"tf\.function.*outside step_fn"):
      tf.function(call)()
  assert _contents(tmp_path) == before
  assert checkpointer.restore_latest() == 1


def test_a_save_killed_while_tensorflow_wrote_its_temporary_folder_is_cleaned_up(
    tmp_path):
  counter = tf.Variable(1.0)
  checkpointer = replicator.Checkpointer(tmp_path, counter=counter)
  checkpointer.save(step=1)
  live = checkpointer._read_pointer()["checkpoint"]  # pylint: disable=protected-access
  # What a save killed before TensorFlow merged its shards leaves, named as
  # functional_saver names it: "<prefix>_temp/part-<shard>-of-<shards>".
  leftover = tmp_path / "ckpt-2-0123456789ab_temp"
  leftover.mkdir()
  for ext in ("index", "data-00000-of-00001"):
    (leftover / f"part-00000-of-00001.{ext}").write_bytes(b"partial")
  # And one killed before it replaced the pointer (the rename of its copy).
  (tmp_path / ".latest.json.tmp-999999").write_text("{}")
  others = tmp_path.parent / f"{tmp_path.name}-other"  # not ours to clean
  others.mkdir()
  (others / "ckpt-2-0123456789ab_temp").mkdir()

  counter.assign(2.0)
  checkpointer.save(step=2)
  kept = checkpointer._read_pointer()["all"]  # pylint: disable=protected-access
  assert live in kept
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["latest.json"] + [
      f"{name}.{ext}" for name in kept for ext in ("data-00000-of-00001", "index")])
  assert (others / "ckpt-2-0123456789ab_temp").is_dir()
  restored = tf.Variable(0.0)
  assert replicator.Checkpointer(tmp_path, counter=restored).restore_latest() == 2
  assert float(restored) == 2.0


@pytest.mark.parametrize("pointer, problem", [
    (b"{\"step\": 3, \"checkp", "not JSON"),
    (b"\xff\xfe garbage", "not JSON"),
    (b"[3, \"ckpt-3-0123456789ab\"]", "a list"),
    (b"{\"step\": 3}", "no 'checkpoint'"),
    (b"{\"checkpoint\": \"ckpt-3-0123456789ab\"}", "no 'step'"),
    (b"{\"step\": \"3\", \"checkpoint\": \"ckpt-3-0123456789ab\"}", "'step': '3'"),
    (b"{\"step\": 3, \"checkpoint\": \"../elsewhere/ckpt-3\"}", "'checkpoint': '../"),
])
def test_a_corrupt_pointer_is_an_error_naming_it_that_changes_nothing(
    tmp_path, pointer, problem):
  counter = tf.Variable(1.0)
  checkpointer = replicator.Checkpointer(tmp_path, counter=counter)
  checkpointer.save(step=3)
  saved = checkpointer._read_pointer()["checkpoint"]  # pylint: disable=protected-access
  (tmp_path / "latest.json").write_bytes(pointer)
  before = _contents(tmp_path)
  counter.assign(5.0)
  path = os.path.join(str(tmp_path), "latest.json")
  for call in (checkpointer.restore_latest, lambda: checkpointer.latest_step,
               lambda: checkpointer.save(step=4)):
    with pytest.raises(ValueError) as raised:
      call()
    message = str(raised.value)
    assert path in message and problem in message, message
    assert saved in message and "delete" in message, message  # what to restore, or start over
    assert _contents(tmp_path) == before
  assert float(counter) == 5.0
