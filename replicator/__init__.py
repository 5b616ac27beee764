"""replicator: write the step for one device, run it on many.

>>> import replicator
>>> repl = replicator.GpuReplicator(device="/cpu:0")
>>> repl.num_replicas
1
"""

from replicator import _tf_check  # first: a clear error for a missing or old TF

from replicator import nn
from replicator import testing
from replicator.base import Replicator
from replicator.divergence import ReplicasDiverged
from replicator.checkpoint import Checkpointer
from replicator.cluster import WorkerLost
from replicator.reduce_options import AllReduceOptions
from replicator.reduce_options import Compression
from replicator.reduce_options import ReduceOp
from replicator.context import InputExhausted
from replicator.gpu import GpuReplicator
from replicator.gpu import MultiGpuReplicator
from replicator.inputs import InputContext
from replicator.inputs import allow_uneven_batches
from replicator.inputs import pad_to_global_batch
from replicator.inputs import skipped_by_input_fn
from replicator.mesh import Mesh
from replicator.optimizers import ReplicatedOptimizer
from replicator.tpu import TpuReplicator
from replicator.variables import ReplicatedVariable

__version__ = "0.1.0"

__all__ = (
    "AllReduceOptions",
    "Checkpointer",
    "Compression",
    "GpuReplicator",
    "InputContext",
    "InputExhausted",
    "Mesh",
    "MultiGpuReplicator",
    "ReduceOp",
    "ReplicasDiverged",
    "ReplicatedOptimizer",
    "ReplicatedVariable",
    "Replicator",
    "TpuReplicator",
    "WorkerLost",
    "allow_uneven_batches",
    "nn",
    "pad_to_global_batch",
    "skipped_by_input_fn",
    "testing",
)
