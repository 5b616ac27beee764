"""Every private name that replicator uses is there, as its record says.

A new TensorFlow, Keras or Sonnet that renames or changes one of them fails
here, naming it, the record and the code that uses it, rather than in a step
that fails deep in TensorFlow or goes subtly wrong. The words of the errors
that replicator matches (`error_texts.MESSAGES`) are checked on the errors
themselves, provoked here.
"""

import glob
import importlib
import inspect
import os
import re
import socket

import keras  # noqa: F401  (the Keras records are checked against the Keras installed)
import pytest
import sonnet as snt
import tensorflow as tf

from replicator import checkpoint_files
from replicator.engines import step_checks
from replicator.engines.in_graph import effects
from replicator.patches import error_texts
from replicator.patches import private_names

USES = private_names.USES
MESSAGES = error_texts.MESSAGES


def _id(record):
  return f"{record.target}[{(USES + MESSAGES).index(record)}]"


def _resolve(use):
  """(the module or class that holds the name, the name's last part)."""
  try:
    owner = importlib.import_module(use.module)
  except ImportError as error:
    pytest.fail(use.changed(f"the module does not import ({error})"))
  if not use.name:
    return owner, ""
  *path, attribute = use.name.split(".")
  for part in path:
    if not hasattr(owner, part):
      pytest.fail(use.changed(f"{owner.__name__} has no {part}"))
    owner = getattr(owner, part)
  return owner, attribute


def _parameters(function):
  """Its parameters' names ("*", "**" for the variable ones), without `self`."""
  kinds = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
  names = [kinds.get(p.kind, p.name) for p in inspect.signature(function).parameters.values()]
  return names[1:] if names[:1] == ["self"] else names


def _lacking_parameters(value, recorded):
  """The recorded parameters that `value` does not take, in the order recorded."""
  if inspect.isclass(value):
    if hasattr(value, "DESCRIPTOR"):  # a protobuf message: its fields
      return [name for name in recorded if name not in value.DESCRIPTOR.fields_by_name]
    value = value.__init__
  try:
    actual = _parameters(value)
  except (TypeError, ValueError):  # a function of C++ with no signature
    return []
  lacking, position = [], 0
  for name in recorded:
    if name in actual[position:]:
      position = actual.index(name, position) + 1
    elif not ({"*", "**"} & set(actual)):
      lacking.append(name)
  return lacking


def _mentions(source: str, name: str) -> bool:
  """Whether `source` has `name` as a whole name (not a part of a longer one)."""
  return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", source) is not None


def _sets(cls, attribute: str) -> bool:
  """Whether `cls` has `attribute`, or it or a class it inherits sets it on self."""
  if hasattr(cls, attribute):
    return True
  assigned = re.compile(rf"\bself\.{re.escape(attribute)}\s*(:[^=\n]*)?=(?!=)")
  for base in inspect.getmro(cls):
    try:
      if assigned.search(inspect.getsource(base)):
        return True
    except (OSError, TypeError):  # a class of C++, or a builtin
      continue
  return False


@pytest.mark.parametrize("use", USES, ids=_id)
def test_each_used_name_exists_as_its_record_says(use):
  assert use.kind in private_names.KINDS and use.kind != "message", use.kind
  if use.kind == "protocol":  # `name` is looked up on replicator's objects
    where = _resolve(private_names.Use(use.module, use.looked_up_by, "", "", ()))
    source = inspect.getsource(getattr(*where) if use.looked_up_by else where[0])
    assert _mentions(source, use.name), use.changed(
        f"{use.module}{'.' + use.looked_up_by if use.looked_up_by else ''} no longer "
        f"looks {use.name} up")
    return
  owner, attribute = _resolve(use)
  if use.kind == "module":
    return
  if use.kind == "instance attribute":
    assert inspect.isclass(owner) and _sets(owner, attribute), use.changed(
        f"{owner.__name__} no longer sets {attribute} on its objects")
    return
  assert hasattr(owner, attribute), use.changed(f"{owner.__name__} has no {attribute}")
  value = getattr(owner, attribute)
  if use.kind == "class":
    assert inspect.isclass(value), use.changed(f"it is {value!r}, not a class")
  elif use.kind == "function":
    assert callable(value) and not inspect.isclass(value), use.changed(
        f"it is {value!r}, not a function")
  elif use.kind == "method":
    assert inspect.isclass(owner) and callable(value), use.changed(
        f"it is {value!r}, not a method of a class")
  elif use.kind == "attribute" and use.text:
    assert value == use.text, use.changed(f"its value is {value!r}, not {use.text!r}")
  lacking = _lacking_parameters(value, use.parameters) if use.parameters else []
  assert not lacking, use.changed(f"it takes no {lacking} (or not in that order)")
  target = value if inspect.isclass(value) else type(value)
  unset = [name for name in use.reads if not _sets(target, name)]
  assert not unset, use.changed(f"its {target.__name__} objects have no {unset}")


@pytest.mark.parametrize("use", USES + MESSAGES, ids=_id)
def test_each_record_says_why_and_is_used_where_it_says(use):
  assert use.why and use.known_for and use.used_in, use.target
  word = use.text or use.name.split(".")[-1] or use.module.split(".")[-1]
  for module in use.used_in[:1] if use.kind == "message" else use.used_in:
    source = inspect.getsource(importlib.import_module(module))
    assert word in source if use.kind == "message" else _mentions(source, word), (
        f"the record of {use.target} says {module} uses {word!r}, which it does not: "
        "remove the record, or correct its used_in.")


def _raised(function, *args):
  try:
    function(*args)
  except Exception as error:  # pylint: disable=broad-except
    return error
  raise AssertionError(f"{function} raised nothing")


def _ran_out():
  gate = effects.Gate()
  return [_raised(tf.function(gate), tf.constant(False))]


def _stacked_outputs():
  spec = tf.TensorSpec([None], tf.float32)
  stack = tf.function(lambda a, b: step_checks.stack_over_replicas([a, b], _stacked_outputs),
                      input_signature=[spec, spec])
  return [_raised(stack, tf.zeros([2]), tf.zeros([3]))]


def _xla_missing_kernel():
  def prints(x):
    tf.print(x)
    return x + 1
  compiled = tf.function(prints, jit_compile=True)
  return [_raised(compiled, tf.constant(1)),  # the in-graph engine's run
          _raised(lambda: compiled.experimental_get_compiler_ir(tf.constant(1))(
              stage="hlo"))]  # the strategy engine's check


def _shape_words():
  matmul = tf.function(tf.linalg.matmul, input_signature=[tf.TensorSpec(None)] * 2)
  return [_raised(matmul, tf.constant(1.0), tf.ones([2, 2])),  # run time
          _raised(tf.linalg.matmul, tf.constant(1.0), tf.ones([2, 2])),
          _raised(snt.Linear(2), tf.constant(1.0)),
          _raised(keras.layers.Dense(2), tf.constant(1.0))]


def _port_taken():
  with socket.socket() as taken:
    taken.bind(("", 0))
    taken.listen(1)
    cluster = tf.train.ClusterSpec({"worker": [f"localhost:{taken.getsockname()[1]}"]})
    return [_raised(tf.distribute.Server, cluster, "worker", 0, "grpc", None, True)]


def _generator_state():
  return [tf.random.Generator.from_seed(1).state.name]


def _checkpoint(tmp_path, damage):
  prefix = tf.train.Checkpoint(v=tf.Variable(tf.range(1000, dtype=tf.float32))).write(
      str(tmp_path / "ckpt"))
  [data] = glob.glob(prefix + ".data-*")
  damage(data)
  return [_raised(lambda: tf.train.load_checkpoint(prefix).get_tensor(
      "v/.ATTRIBUTES/VARIABLE_VALUE"))]


def _flip_a_byte(path):
  with open(path, "r+b") as f:
    f.seek(50)
    byte = f.read(1)
    f.seek(50)
    f.write(bytes([byte[0] ^ 0xFF]))


def _truncate(path):
  os.truncate(path, 100)


# pylint: disable=protected-access
PROVOKED = {  # a message record's text: the errors (or names) it is matched in
    effects.RAN_OUT: lambda tmp_path: _ran_out(),
    step_checks._STACKED_OUTPUTS: lambda tmp_path: _stacked_outputs(),
    step_checks._XLA_MISSING_KERNEL.pattern: lambda tmp_path: _xla_missing_kernel(),
    step_checks._SHAPE_WORDS.pattern: lambda tmp_path: _shape_words(),
    "gRPC server": lambda tmp_path: _port_taken(),
    "StateVar": lambda tmp_path: _generator_state(),
    "hecksum": lambda tmp_path: _checkpoint(tmp_path, _flip_a_byte),
    "No such file": lambda tmp_path: _checkpoint(tmp_path, os.remove),
    checkpoint_files._DATA_FILE.pattern: lambda tmp_path: _checkpoint(tmp_path, os.remove),
    "Read less bytes": lambda tmp_path: _checkpoint(tmp_path, _truncate),
}
# pylint: enable=protected-access


@pytest.mark.parametrize("message", MESSAGES, ids=_id)
def test_each_matched_message_is_in_tensorflows_error(message, tmp_path):
  assert message.kind == "message"
  owner, attribute = _resolve(message)
  assert hasattr(owner, attribute), message.changed(f"{owner.__name__} has no {attribute}")
  assert message.text in PROVOKED, (
      f"{message.target}: add to PROVOKED how to raise the error whose words "
      f"{message.text!r} replicator matches")
  for found in PROVOKED[message.text](tmp_path):
    text = found if isinstance(found, str) else str(found)
    assert re.search(message.text, text), message.changed(
        f"its {type(found).__name__} says {text[:400]!r}, without {message.text!r}")
