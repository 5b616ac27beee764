"""Every private name that replicator patches is there, as its record says.

A new TensorFlow or Keras that renames or changes one of them fails here,
naming it and the patch, rather than in a step that goes subtly wrong.
"""

import importlib
import inspect
import threading

import catalogue
import keras  # the Keras patches are checked against the Keras installed
import numpy as np
import pytest
import tensorflow as tf

from replicator.patches import registry

PATCHES = registry.PATCHES
TRACE_ONLY = [patch for patch in PATCHES if patch.trace_only]


def _id(patch):
  return f"{patch.target}[{PATCHES.index(patch)}]"


def _parameters(function):
  kinds = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
  return tuple(kinds.get(p.kind, p.name)
               for p in inspect.signature(function).parameters.values())


def _samples():
  """An object of each patched class, to find what the replacements read."""
  function = tf.function(lambda x: x)
  return {
      "Function": function,
      "ConcreteFunction": function.get_concrete_function(tf.constant(1.0)),
      "Generator": tf.random.Generator.from_seed(1),
      "Variable": keras.Variable(1.0),
  }


def _resolve(patch):
  """(owner, attribute, the value now), failing with the patch's message."""
  try:
    owner = importlib.import_module(patch.module)
  except ImportError:
    pytest.fail(patch.missing())
  *path, attribute = patch.name.split(".")
  for part in path:
    owner = getattr(owner, part, None)
    if owner is None:
      pytest.fail(patch.missing())
  if not hasattr(owner, attribute):
    pytest.fail(patch.missing())
  return owner, attribute, getattr(owner, attribute)


@pytest.mark.parametrize("patch", PATCHES, ids=_id)
def test_each_patched_name_exists_with_the_kind_and_parameters_recorded(patch):
  owner, attribute, value = _resolve(patch)
  library = (f"Keras {keras.__version__}" if patch.module.startswith("keras")
             else f"TensorFlow {tf.__version__}")
  changed = (f"replicator patches {patch.target}, which this {library} has "
             f"changed: %s; see {patch.patched_in.replace('.', '/')}.py (known "
             f"for {patch.known_for}) and its record in "
             "replicator/patches/registry.py.")
  if patch.kind == "rules":
    assert isinstance(value, tuple) and all(
        callable(getattr(rule, "get_action", None)) for rule in value), (
            changed % f"expected a tuple of AutoGraph rules, found {value!r}")
    return
  if patch.kind == "method":
    assert inspect.isclass(owner), changed % f"{owner!r} is no longer a class"
  assert inspect.isfunction(value), (
      changed % f"expected a Python {patch.kind}, found {value!r}")
  assert _parameters(value) == patch.parameters, (
      changed % f"it takes {_parameters(value)}, the patch expects {patch.parameters}")
  if patch.reads:
    sample = _samples()[owner.__name__]
    lacking = [name for name in patch.reads if not hasattr(sample, name)]
    assert not lacking, changed % (
        f"its {owner.__name__} objects lack {lacking}, which the patch reads")


def test_every_patch_says_why_where_and_for_which_versions():
  for patch in PATCHES:
    assert patch.kind in ("function", "method", "rules"), patch.target
    assert patch.why and patch.known_for, patch.target
    assert importlib.import_module(patch.patched_in), patch.target
  # What stays installed outside a trace is only what must.
  assert [p.make for p in PATCHES if not p.trace_only] == [
      importlib.import_module("replicator.patches.autograph_rules").with_ours]


def test_a_name_missing_from_tensorflow_is_an_error_that_names_it():
  missing = registry.Patch(
      module="tensorflow.python.framework.random_seed", name="no_such_function",
      kind="function", parameters=(), reads=(), why="", known_for="TensorFlow 2.16",
      patched_in="replicator.patches.randomness", make=lambda original: original)
  with pytest.raises(RuntimeError, match=(
      r"replicator patches tensorflow\.python\.framework\.random_seed\."
      r"no_such_function, which this TensorFlow .* no longer has; see "
      r"replicator/patches/randomness\.py")):
    missing.owner()
  keras_only = registry.Patch(
      module="keras.src.backend.tensorflow.random", name="no_such_function",
      kind="function", parameters=(), reads=(), why="", known_for="Keras 3",
      patched_in="replicator.patches.keras_compat", make=lambda original: original,
      optional=True)
  assert keras_only.owner() is None  # Keras' are skipped (with a warning)


def _values():
  """What each trace-only patch's name holds now."""
  values = []
  for patch in TRACE_ONLY:
    owner, attribute, value = _resolve(patch)
    values.append((value, attribute in vars(owner)))
  return values


def _installed(before, now):
  return [b[0] is not n[0] for b, n in zip(before, now)]


def test_trace_only_patches_hold_in_a_step_and_the_originals_after_it():
  before = _values()
  repl = catalogue.make("multi_gpu_2")
  with repl.context():
    dropout = keras.layers.Dropout(0.5, seed=1)
  inside = []

  def step_fn():
    inside.append(_values())
    return dropout(tf.ones([2, 8]), training=True)

  out = repl.run(step_fn)
  assert not np.array_equal(out[0], out[1])  # Keras' seeds per replica
  assert inside and all(all(_installed(before, now)) for now in inside), [
      p.target for p, on in zip(TRACE_ONLY, _installed(before, inside[0])) if not on]
  # Outside the trace, the very objects as before (an inherited method is
  # inherited again, not copied onto the class).
  after = _values()
  restored = [b[0] is a[0] and b[1] == a[1] for b, a in zip(before, after)]
  assert all(restored), [p.target for p, ok in zip(TRACE_ONLY, restored) if not ok]


def test_overlapping_traces_in_threads_install_once_and_restore_at_the_last():
  before = _values()
  first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
  seen = {}

  def first():
    with registry.while_tracing():
      first_in.set()
      second_in.wait(30)
    first_out.set()

  def second():
    first_in.wait(30)
    with registry.while_tracing():
      second_in.set()
      first_out.wait(30)
      seen["after the first left"] = _values()

  threads = [threading.Thread(target=first), threading.Thread(target=second)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(60)
  assert all(_installed(before, seen["after the first left"]))
  assert not any(_installed(before, _values()))


def test_a_failing_trace_restores_the_originals():
  before = _values()
  repl = catalogue.make("multi_gpu_2")

  def step_fn():
    raise ValueError("step_fn's own error")

  with pytest.raises(ValueError, match="step_fn's own error"):
    repl.run(step_fn)
  assert not any(_installed(before, _values()))
