"""The words of TensorFlow's errors that replicator tells apart, in one list.

Where TensorFlow raises an error type of its own for a case, replicator
catches that type. These cases share their type with other failures, and the
message is the one sign: each record (a `uses.Use` of kind
"message") says which words, where replicator matches them, and why no type
or field tells the case. `tests/patches/test_private_names.py` provokes each
error on the TensorFlow installed and matches the words, and fails on a match
against an error's text in replicator that no record names.
"""

from replicator.patches import uses

Use = uses.Use
_PY = "tensorflow.python."
_ERRORS = _PY + "framework.errors_impl"
_STEP_CHECKS = "replicator.engines.step_checks"

_OP_NAME = ("TensorFlow raises {} for many failures; its message names the op "
            "that failed, with its name scope, and no field of the error does: "
            "replicator names its own op so, and finds the name there.")

_READER = ("A damaged checkpoint's error says {}: TensorFlow's checkpoint reader "
           "raises a plain OpError (code UNKNOWN), where a NotFoundError or a "
           "DataLossError would say it by its type.")

MESSAGES = (
    Use(_ERRORS, "OutOfRangeError", "message", text="replicator_input_ran_out",
        why=_OP_NAME.format("OutOfRangeError") + " Then the data ran out before "
        "the step (the gate, effects.RAN_OUT); else step_fn raised it itself.",
        used_in=("replicator.engines.in_graph.effects", "replicator.engines.in_graph.steps")),
    Use(_ERRORS, "InvalidArgumentError", "message", text="outputs_of_every_replica",
        why=_OP_NAME.format("InvalidArgumentError") + " Then the replicas' "
        "outputs differ in shape (step_checks._STACKED_OUTPUTS).",
        used_in=(_STEP_CHECKS,)),
    Use(_ERRORS, "InvalidArgumentError", "message",
        text=r"No registered '(\w+)' OpKernel for XLA_\w+_JIT",
        why="XLA cannot compile an op (tf.print, string ops): the error names the "
        "ops and what to do. Its type is that of any bad argument (a ValueError "
        "from the strategy engine's compile to HLO), the op types are only in "
        "the words.", used_in=(_STEP_CHECKS,)),
    Use(_ERRORS, "InvalidArgumentError", "message",
        text=r"rank|shape|ndim|dims\b|dimension",
        why="A shape error (InvalidArgumentError, ValueError or TypeError, from "
        "TensorFlow, Keras or Sonnet, no type of its own) where the input "
        "element has a scalar leaf gets the hint to batch the dataset.",
        used_in=(_STEP_CHECKS,)),
    Use(_ERRORS, "UnknownError", "message", text="gRPC server",
        why="A worker's server cannot start (its port is taken): the error says "
        "so. TensorFlow raises UnknownError, as for other failures.",
        used_in=("replicator.multiworker.cluster",)),
    Use(_PY + "ops.stateful_random_ops", "Generator", "message", text="StateVar",
        why="The name of a generator's state variable: the error for a variable "
        "made outside every context says how to make a generator inside one.",
        used_in=(_STEP_CHECKS,)),
    Use(_ERRORS, "OpError", "message", text="hecksum",
        why=_READER.format("a tensor whose bytes changed"),
        used_in=("replicator.checkpoint_files",)),
    Use(_ERRORS, "OpError", "message", text="No such file",
        why=_READER.format("a missing data file"),
        used_in=("replicator.checkpoint_files",)),
    Use(_ERRORS, "OpError", "message", text=r"[^\s'\"]+\.data-(\d{5})-of-(\d{5})",
        why=_READER.format("which data file failed"),
        used_in=("replicator.checkpoint_files",)),
    Use("builtins", "IndexError", "message", text="Read less bytes",
        why="The checkpoint reader's error for a truncated data file (an IndexError, "
        "matched by its type too).", used_in=("replicator.checkpoint_files",)),
)
