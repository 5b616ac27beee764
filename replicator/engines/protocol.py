"""`Engine`: all that `base.Replicator` calls of the engine it holds, so that a
replicator's semantics (inputs, checkpoints, errors, counters) are written once."""

from typing import Any, Callable, ContextManager, Iterator, Optional, Protocol, Sequence, Tuple

import tensorflow as tf


class Engine(Protocol):
  """Replicated variables and the compiled step of one replicator."""

  @property
  def created(self) -> Sequence[tf.Variable]:
    """Every variable made in the scope or in a step, in creation order."""

  def scope(self) -> ContextManager:
    """Within, variables made are replicated (`repl.context()`)."""

  def iterator(self, dataset: tf.data.Dataset,
               for_host: Optional[Callable] = None) -> Iterator:
    """An iterator of `dataset`'s batches, one batch per local replica a step.

    `for_host(host, hosts, replicas_per_host)` makes the dataset of each host
    that this process feeds (several TPU hosts); None where it feeds one.
    """

  def run(self, step_fn: Callable, input_fn: Optional[Callable], iterator,
          element_spec, steps: int, args: Sequence[Any], *,
          count: Callable[[int], None], uneven_batches: bool) -> Tuple[int, Any, bool]:
    """Runs up to `steps` steps of `step_fn` on every replica.

    Returns `(steps completed, outputs of the last, whether batches were
    uneven)`; `count(ran)` is called as steps complete.
    """

  def copies(self, variable: tf.Variable) -> Sequence[tf.Variable]:
    """The local copies of `variable`, a variable this engine made; a
    TypeError naming it for any other."""

  def random_generator(self, seed: int) -> Any:
    """A random generator whose draws in a step differ between replicas."""

  def clear(self) -> None:
    """Forgets the compiled steps (their variables stay)."""
