"""`Use`: the record of one private name of TensorFlow, Keras or Sonnet that
replicator uses as it is (`private_names.USES`, `error_texts.MESSAGES`)."""

import dataclasses
from typing import Tuple

from replicator.patches import registry

_TF = registry._TF  # pylint: disable=protected-access

KINDS = ("module", "class", "function", "method", "attribute", "instance attribute",
         "protocol", "message")  # `Use.kind`


@dataclasses.dataclass(frozen=True)
class Use:
  """One private name of TensorFlow, Keras or Sonnet that replicator uses as it is.

  Attributes:
    module: the module that holds the name.
    name: the name in `module`, dotted under a class ("Graph._variable_creator_stack");
      "" for the module itself.
    kind: what the name must be, and so how the version test checks it:
      "module": `module` imports.
      "class", "function": a class or function of `module`.
      "method": a function that the class defines or inherits.
      "attribute": a value that the module or class holds (a property too).
      "instance attribute": set on each object, not on the class: the test
        finds `self.<name> =` in the source of the class or of a base.
      "protocol": a name that TensorFlow or Keras looks up on replicator's own
        objects: the test finds it in the source of `looked_up_by`.
      "message" (`error_texts`): words of an error (`name`, an error class
        of `module`) that replicator matches: the test provokes the error on
        the TensorFlow installed and matches `text` against its message.
    why: what replicator does with it, and why it has no public way.
    used_in: the replicator modules that use it.
    parameters: of a function, method or class (its constructor): the
      parameters the code passes, in the order of the signature; of a
      protobuf message class, the fields the code sets or reads.
    reads: the attributes the code reads or sets on the value (on an instance).
    looked_up_by: (protocol) the function or class of `module` whose source
      looks the name up; "" for the module's whole source.
    text: (message) a regular expression for the words, as `used_in[0]`
      holds it; (attribute) the value, which the code writes out literally.
    known_for: the versions whose `name` is as the record says.
  """
  module: str
  name: str
  kind: str
  why: str
  used_in: Tuple[str, ...]
  parameters: Tuple[str, ...] = ()
  reads: Tuple[str, ...] = ()
  looked_up_by: str = ""
  text: str = ""
  known_for: str = _TF

  @property
  def target(self) -> str:
    return f"{self.module}.{self.name}" if self.name else self.module

  def changed(self, how: str) -> str:
    """The error for a version where the name is not as recorded (`how`)."""
    where = ", ".join(m.replace(".", "/") + ".py" for m in self.used_in)
    return (f"replicator uses {self.target} ({self.kind}), and in the versions "
            f"installed {how}; see {where} (known for {self.known_for}). Use a "
            "version it is known for, or update that code and this record in "
            f"replicator/patches/{'error_texts' if self.kind == 'message' else 'private_names'}"
            ".py.")
