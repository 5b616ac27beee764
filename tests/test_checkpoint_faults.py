"""Checkpointer under misuse and faults: inside a step, crashed saves, a corrupt
pointer, damaged checkpoint files."""

import logging
import os

import numpy as np
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


# A damaged checkpoint: its files changed after they were written. Each way,
# the file it names, given the checkpoint's prefix.
DATA = ".data-00000-of-00001"


def _truncate(prefix):
  with open(prefix + DATA, "r+b") as f:
    f.truncate(os.path.getsize(prefix + DATA) // 2)
  return prefix + DATA


def _flip_bytes(prefix):
  """Flips 8 bytes in the middle of the data file (inside the largest tensor,
  where TensorFlow's checksum finds them)."""
  with open(prefix + DATA, "r+b") as f:
    f.seek(os.path.getsize(prefix + DATA) // 2)
    middle = f.read(8)
    f.seek(-8, os.SEEK_CUR)
    f.write(bytes(b ^ 0xFF for b in middle))
  return prefix + DATA


def _delete_shard(prefix):
  os.remove(prefix + DATA)
  return prefix + DATA


def _garble_index(prefix):
  """Overwrites the index's footer (its block handles and magic number)."""
  with open(prefix + ".index", "r+b") as f:
    f.seek(-48, os.SEEK_END)
    f.write(b"\x07" * 48)
  return prefix + ".index"


DAMAGES = {"truncated": _truncate, "bytes_flipped": _flip_bytes,
           "shard_deleted": _delete_shard, "index_garbled": _garble_index}


def _saved_at_steps(directory, steps=(1, 2, 3)):
  """A Checkpointer of one variable saved at `steps`, and the values saved at each."""
  values = tf.Variable(np.zeros(4096, np.float32))  # most of the data file
  checkpointer = replicator.Checkpointer(directory, values=values, max_to_keep=5)
  saved = {}
  for step in steps:
    values.assign(np.random.RandomState(step).randn(4096).astype(np.float32))
    checkpointer.save(step)
    saved[step] = values.numpy()
  return values, checkpointer, saved


def _prefix(checkpointer, step):
  names = checkpointer._read_pointer()["all"]  # pylint: disable=protected-access
  name, = [n for n in names if n.startswith(f"ckpt-{step}-")]
  return os.path.join(checkpointer.directory, name)


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_checkpoint_names_itself_and_the_previous_one_which_restores(
    tmp_path, caplog, damage):
  values, checkpointer, saved = _saved_at_steps(tmp_path)
  latest, previous = _prefix(checkpointer, 3), _prefix(checkpointer, 2)
  damaged_file = DAMAGES[damage](latest)
  before = _contents(tmp_path)
  values.assign(np.zeros(4096, np.float32))
  with pytest.raises(replicator.CheckpointCorrupted) as raised:
    checkpointer.restore_latest()
  error = raised.value
  message = str(error)
  assert "ckpt-3-" in message and damaged_file in message, message
  assert os.path.basename(previous) in message and "fall_back=True" in message, message
  assert error.checkpoint == os.path.basename(latest) and error.step == 3
  assert error.path == damaged_file
  assert (error.previous, error.previous_step) == (os.path.basename(previous), 2)
  np.testing.assert_array_equal(values.numpy(), np.zeros(4096))  # nothing restored
  assert isinstance(error, ValueError)

  with caplog.at_level(logging.WARNING):
    assert checkpointer.restore_latest(fall_back=True) == 2
  np.testing.assert_array_equal(values.numpy(), saved[2])
  logged = [r.getMessage() for r in caplog.records if "fall_back=True" in r.getMessage()]
  assert len(logged) == 1, [r.getMessage() for r in caplog.records]
  assert os.path.basename(previous) in logged[0] and os.path.basename(latest) in logged[0]
  assert damaged_file in logged[0]
  assert _contents(tmp_path) == before  # nothing deleted, nothing written
  assert checkpointer.latest_step == 3  # the pointer still names the damaged one


def test_the_fall_back_skips_every_damaged_checkpoint_and_without_one_raises(tmp_path):
  values, checkpointer, saved = _saved_at_steps(tmp_path)
  _truncate(_prefix(checkpointer, 3))
  _flip_bytes(_prefix(checkpointer, 2))
  assert checkpointer.restore_latest(fall_back=True) == 1
  np.testing.assert_array_equal(values.numpy(), saved[1])
  _delete_shard(_prefix(checkpointer, 1))
  values.assign(np.zeros(4096, np.float32))
  for fall_back in (False, True):
    with pytest.raises(replicator.CheckpointCorrupted,
                       match=r"ckpt-3-.*No earlier checkpoint in the directory reads whole"):
      checkpointer.restore_latest(fall_back=fall_back)
  np.testing.assert_array_equal(values.numpy(), np.zeros(4096))
  assert len(list(tmp_path.glob("ckpt-*.index"))) == 3
  with pytest.raises(TypeError, match=r"fall_back: expected True or False, got 'yes'"):
    checkpointer.restore_latest(fall_back="yes")


def test_the_fall_back_resumes_the_inputs_where_the_previous_checkpoint_left_them(
    tmp_path):
  """Scalar elements, one per replica a step: after falling back to step 2,
  the next step gets the elements of step 3 (as a run that never stopped)."""
  repl = catalogue.make("multi_gpu_2")
  n = repl.num_replicas
  with repl.context():
    total = tf.Variable(0.0)

  def step_fn(x):
    total.assign_add(tf.cast(x, tf.float32))
    return x

  def input_fn(ctx):
    del ctx
    return tf.data.Dataset.range(100)

  checkpointer = replicator.Checkpointer(tmp_path, total=total)
  elements = np.arange(100).reshape(-1, n)  # step i's elements
  saved = {}
  for step in range(4):
    np.testing.assert_array_equal(repl.run(step_fn, input_fn).numpy(), elements[step])
    if step in (1, 2):
      checkpointer.save(step + 1)
      saved[step + 1] = float(total)
  _truncate(_prefix(checkpointer, 3))
  assert checkpointer.restore_latest(fall_back=True) == 2
  assert float(total) == saved[2]
  np.testing.assert_array_equal(repl.run(step_fn, input_fn).numpy(), elements[2])
  repl.shutdown()


def test_workers_decide_alike_where_only_another_worker_finds_the_newest_damaged(
    tmp_path, monkeypatch):
  """This worker reads ckpt-3 whole, another does not: every worker raises, or,
  with fall_back, every worker restores ckpt-2 (a stand-in for the workers'
  eager collectives, answering as that other worker)."""
  values, checkpointer, saved = _saved_at_steps(tmp_path)

  class TwoWorkers:
    mesh = replicator.Mesh(devices=["/cpu:0"])
    calls = []

    def _across_workers(self, values, merge_op):  # the other worker, as it answers
      assert merge_op == "Min"
      other = [-1] if len(values) == 1 else list(values)  # it found ckpt-3 damaged
      self.calls.append(list(values))
      return np.minimum(values, other)

  from replicator import checkpoint  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(checkpoint, "_clustered_replicator", TwoWorkers)
  with pytest.raises(replicator.CheckpointCorrupted,
                     match=r"ckpt-3-.*another worker could not read its files whole"):
    checkpointer.restore_latest()
  assert TwoWorkers.calls == [[3, -3], [0], [2, -2]]
  assert checkpointer.restore_latest(fall_back=True) == 2
  np.testing.assert_array_equal(values.numpy(), saved[2])
