"""Every process-wide patch of TensorFlow's and Keras' internals, in one list.

Replicator replaces a few private names of TensorFlow and Keras so that code
written for one device behaves per replica (`PATCHES`). Each replacement
differs from the original only on a replica's thread while a step is traced
(`collectives.replica_context.current()`), yet left installed it would still
change TensorFlow for the rest of the process and for every other user of it.
So `while_tracing()`, which the compiled step holds around the replicas' trace,
installs them when the first trace begins and puts the originals back when
the last one ends. A patch that must also hold outside a trace is installed
from import on, and its record says why.

`tests/patches/test_patch_targets.py` checks every record against the
TensorFlow and Keras installed: a version that renames or changes one of
these names fails there, naming it, before a step goes wrong.
"""

import contextlib
import dataclasses
import importlib
import logging
import sys
import threading
from typing import Any
from typing import Callable
from typing import Optional
from typing import Tuple

from replicator.patches import autograph_rules
from replicator.patches import keras_compat
from replicator.patches import nested_functions
from replicator.patches import randomness

# The versions CI tests (`_tf_check.TESTED`): the whole suite on 2.21, and on
# 2.20 the TPU engine's tests, whose steps install these patches.
_TF = "TensorFlow 2.20-2.21"
_KERAS = "Keras 3.x (3.15 checked)"


@dataclasses.dataclass(frozen=True)
class Patch:
  """One private name of TensorFlow or Keras that replicator replaces.

  Attributes:
    module: the module that holds the name.
    name: the name in `module`, dotted under a class ("Generator._preprocess_key").
    kind: what the name must be: "function", "method" (a function that the
      class defines or inherits) or "rules" (AutoGraph's tuple of rules).
    parameters: a function's or method's parameter names, "*" and "**" for its
      variable ones; () for "rules".
    reads: the attributes the replacement reads of the method's object, as
      private as the name itself.
    why: what goes wrong in a step without the patch.
    patched_in: the replicator module that writes the replacement.
    make: the replacement, from what is in place (the original).
    known_for: the versions whose `name` is as the replacement expects.
    trace_only: whether it is installed only while a step is traced; if
      not, it is installed from import on, for the reason `why` gives.
    optional: Keras' names: where one is missing, a warning (once) and steps
      traced without the patch, rather than an error at every trace: Keras
      is released apart from TensorFlow, and a program without Keras layers
      must not fail for a Keras rename. (Keras is imported by then, by
      `replicator.optimizers`, so `owner` imports the module.)
    undo: what to leave in place of a value that replaced ours since it was
      installed (by default, that value stays).
  """
  module: str
  name: str
  kind: str
  parameters: Tuple[str, ...]
  reads: Tuple[str, ...]
  why: str
  patched_in: str
  make: Callable[[Any], Any]
  known_for: str
  trace_only: bool = True
  optional: bool = False
  undo: Optional[Callable[[Any], Any]] = None

  @property
  def target(self) -> str:
    return f"{self.module}.{self.name}"

  def missing(self) -> str:
    """The error for a TensorFlow or Keras that lacks `name`."""
    library = "Keras" if self.module.startswith("keras") else "TensorFlow"
    version = getattr(sys.modules.get(self.module.split(".")[0]), "__version__", "?")
    return (f"replicator patches {self.target}, which this {library} ({version}) "
            f"no longer has; see {self.patched_in.replace('.', '/')}.py (known "
            f"for {self.known_for}). Use a {library} version that it is known "
            "for, or update the patch and its record in "
            "replicator/patches/registry.py.")

  def owner(self) -> Optional[Tuple[Any, str]]:
    """(the module or class that holds the name, the name's last part).

    None where the record is `optional` and the name is missing (a Keras
    that replicator does not know; the tests say so).
    """
    try:
      owner = importlib.import_module(self.module)
    except ImportError as error:
      if not self.optional:
        raise RuntimeError(self.missing()) from error
      owner = None
    *path, attribute = self.name.split(".")
    for part in path:
      owner = getattr(owner, part, None)
    if owner is None or not hasattr(owner, attribute):
      if not self.optional:
        raise RuntimeError(self.missing())
      if self.target not in _warned:  # once, not at every trace
        _warned.add(self.target)
        logging.warning("replicator: %s", self.missing())
      return None
    return owner, attribute


_AUTOGRAPH = "tensorflow.python.autograph.core.config"
_FUNCTION = "tensorflow.python.eager.polymorphic_function.polymorphic_function"
_CONCRETE = "tensorflow.python.eager.polymorphic_function.concrete_function"
_RANDOM_SEED = "tensorflow.python.framework.random_seed"
_STATEFUL_RANDOM = "tensorflow.python.ops.stateful_random_ops"
_KERAS_BACKEND = "keras.src.backend.tensorflow"

_KERAS_SEEDS = (
    "Keras' random ops (Dropout, keras.random.*, augmentation layers) are "
    "stateless, seeded by a SeedGenerator whose state is the same on every "
    "replica: every replica would draw the same numbers. Inside a step, "
    "replica r's seed is offset by a function of r.")
_KERAS_UPDATE = (
    "Keras implements it as assign(self +/- value): a SUM-aggregated variable "
    "would get N times its old value plus the changes. Inside a step it goes "
    "to the replicated variable's own, which sums the changes.")

_NESTED = "replicator.patches.nested_functions"
_RANDOMNESS = "replicator.patches.randomness"
_KERAS_COMPAT = "replicator.patches.keras_compat"
_AUTOGRAPH_RULES = "replicator.patches.autograph_rules"

PATCHES = (
    Patch(module=_FUNCTION, name="Function.__call__", kind="method",
          parameters=("self", "*", "**"),
          reads=("_run_functions_eagerly", "_jit_compile", "_attributes",
                 "input_signature", "_clone", "_autograph", "python_function",
                 "_experimental_autograph_options"),
          why="tf.function keeps one trace per input signature, blind to the "
          "replica being traced: replica 1 would run replica 0's trace (its "
          "variable copies, its updates). A tf.function that step_fn calls is "
          "traced inline, or copied per replica where it keeps its boundary.",
          patched_in=_NESTED, make=nested_functions.calls_per_replica,
          known_for=_TF),
    Patch(module=_CONCRETE, name="ConcreteFunction.__call__", kind="method",
          parameters=("self", "*", "**"), reads=("variables", "name"),
          why="A concrete function made outside the step holds the variable "
          "copies it was traced with; called on another replica it would use "
          "those. It is refused with an error instead.",
          patched_in=_NESTED, make=nested_functions.concrete_calls_checked,
          known_for=_TF),
    Patch(module=_RANDOM_SEED, name="get_seed", kind="function",
          parameters=("op_seed",), reads=(),
          why="Stateful tf.random ops take their op seed from it: replicas "
          "tracing the same code with the same seeds would draw the same "
          "numbers. Inside a step the replica id is folded into the op seed.",
          patched_in=_RANDOMNESS, make=randomness.seed_per_replica,
          known_for=_TF),
    Patch(module=_STATEFUL_RANDOM, name="Generator._preprocess_key",
          kind="method", parameters=("self", "key"), reads=("state", "algorithm"),
          why="A tf.random.Generator made in repl.context() has one replicated "
          "state: every replica would draw the same numbers. Inside a step each "
          "replica hashes its id into the key, as tf.distribute does. Draws "
          "outside a step (repl.random_generator's too) need nothing of it.",
          patched_in=_RANDOMNESS, make=randomness.key_per_replica, known_for=_TF),
    Patch(module=f"{_KERAS_BACKEND}.random", name="draw_seed", kind="function",
          parameters=("seed",), reads=(), why=_KERAS_SEEDS,
          patched_in=_KERAS_COMPAT, make=keras_compat.fold_replica_into_seed,
          known_for=_KERAS, optional=True),
    Patch(module=f"{_KERAS_BACKEND}.image", name="draw_seed", kind="function",
          parameters=("seed",), reads=(), why=_KERAS_SEEDS,
          patched_in=_KERAS_COMPAT, make=keras_compat.fold_replica_into_seed,
          known_for=_KERAS, optional=True),
    Patch(module=f"{_KERAS_BACKEND}.core", name="Variable.assign_add",
          kind="method", parameters=("self", "value"), reads=("_value",),
          why=_KERAS_UPDATE, patched_in=_KERAS_COMPAT,
          make=keras_compat.delegate_to_replicated("assign_add"),
          known_for=_KERAS, optional=True),
    Patch(module=f"{_KERAS_BACKEND}.core", name="Variable.assign_sub",
          kind="method", parameters=("self", "value"), reads=("_value",),
          why=_KERAS_UPDATE, patched_in=_KERAS_COMPAT,
          make=keras_compat.delegate_to_replicated("assign_sub"),
          known_for=_KERAS, optional=True),
    Patch(module=f"{_KERAS_BACKEND}.nn", name="_compute_moments_sync",
          kind="function", parameters=("x", "axes", "keepdims"), reads=(),
          why="BatchNormalization(synchronized=True) sums its statistics over "
          "tf.distribute's replica context, a single replica inside a step: the "
          "flag did nothing. Inside a step the sums go through our all-reduce.",
          patched_in=_KERAS_COMPAT, make=keras_compat.sum_over_replicas,
          known_for=_KERAS, optional=True),
    Patch(module=f"{_KERAS_BACKEND}.optimizer", name="TFOptimizer._all_reduce_sum_gradients",
          kind="method", parameters=("self", "grads_and_vars"), reads=(),
          why="Inside tf.distribute's replica context (the strategy engine's "
          "steps) a Keras optimizer sums the gradients over the replicas "
          "itself; the wrapped optimizer has averaged them already, so N "
          "replicas would apply N times the mean. Its update skips that sum.",
          patched_in=_KERAS_COMPAT, make=keras_compat.reduced_once,
          known_for=_KERAS, optional=True),
    Patch(module="tensorflow._api.v2.__internal__.distribute.interim",
          name="maybe_merge_call", kind="function",
          parameters=("fn", "strategy", "*", "**"), reads=(),
          why="A Keras optimizer applies its update (and weight decay) in a "
          "merge_call, which in the strategy engine's steps applies every "
          "replica's values to every copy: in the XLA check, copies on other "
          "devices. The wrapped optimizer's update runs in the replica's "
          "context instead, each replica updating its own copy.",
          patched_in=_KERAS_COMPAT, make=keras_compat.updates_own_copies,
          known_for=_TF),
    Patch(module=_AUTOGRAPH, name="CONVERSION_RULES", kind="rules",
          parameters=(), reads=(),
          why="Sonnet's modules that never call the user's code back are written "
          "to be traced without AutoGraph; converting them makes the first "
          "trace of a step that builds them much slower (benchmarks/RESULTS.md, "
          "\"Time to the first training step\"). The user's own tf.functions "
          "still convert them.",
          patched_in=_AUTOGRAPH_RULES, make=autograph_rules.with_sonnet_as_written,
          known_for=_TF, undo=autograph_rules.without_sonnet_rules),
    Patch(module=_AUTOGRAPH, name="CONVERSION_RULES", kind="rules",
          parameters=(), reads=(),
          why="Replicator's own code is plain Python, to run as written. Always, "
          "not only in a trace: the user's converted functions call it outside "
          "steps too (a CrossReplicaBatchNorm or a ReplicaGenerator in an "
          "evaluation tf.function, methods of variables made in repl.context()).",
          patched_in=_AUTOGRAPH_RULES, make=autograph_rules.with_ours,
          known_for=_TF, trace_only=False),
)

_lock = threading.Lock()
_warned = set()  # targets found missing, said once
_traces = 0  # traces under `while_tracing()` now, in any thread
_INHERITED = object()  # a class attribute that the class inherits
# (patch, owner, attribute, what the owner itself held, replacement), in the
# order installed.
_installed = []


def _install(patch: Patch):
  """Installs `patch`; returns what `_restore` needs, or None if not installed."""
  found = patch.owner()
  if found is None:
    return None
  owner, attribute = found
  own = vars(owner).get(attribute, _INHERITED)
  replacement = patch.make(getattr(owner, attribute))
  setattr(owner, attribute, replacement)
  return patch, owner, attribute, own, replacement


def _restore(patch: Patch, owner, attribute: str, own, replacement):
  current = getattr(owner, attribute, None)
  if current is replacement:
    if own is _INHERITED:
      delattr(owner, attribute)
    else:
      setattr(owner, attribute, own)
  elif patch.undo is not None:
    setattr(owner, attribute, patch.undo(current))


def _restore_all():
  while _installed:
    _restore(*_installed.pop())


@contextlib.contextmanager
def while_tracing():
  """Inside, every trace-only patch is installed, in every thread.

  Reference-counted: the first of the traces that overlap (the replicas of
  one step trace on threads of their own; several replicators may trace at
  once) installs them, the last one out restores the originals.
  """
  global _traces
  with _lock:
    if _traces == 0:
      try:
        for patch in PATCHES:
          if patch.trace_only:
            installed = _install(patch)
            if installed is not None:
              _installed.append(installed)
      except BaseException:
        _restore_all()
        raise
    _traces += 1
  try:
    yield
  finally:
    with _lock:
      _traces -= 1
      if _traces == 0:
        _restore_all()


for _patch in PATCHES:  # the permanent ones, from import on
  if not _patch.trace_only:
    _install(_patch)
