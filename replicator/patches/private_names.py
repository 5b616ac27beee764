"""Every private name of TensorFlow, Keras and Sonnet that replicator uses as it is.

`registry.PATCHES` holds the names replicator replaces; `USES` the others:
what it reads, calls, sets, subclasses or imports (a private module path is a
private name too), and what TensorFlow looks up on replicator's own objects;
`error_texts.MESSAGES` the words of TensorFlow's errors that it matches.
`tests/patches/test_private_names.py` checks every record against the versions
installed, and fails on a private name in replicator's source that no record
covers.
"""

from replicator.patches import autograph_rules
from replicator.patches import registry
from replicator.patches import uses

_KERAS = registry._KERAS  # pylint: disable=protected-access
_SONNET = "Sonnet 2.0.x (2.0.2 checked)"

KINDS = uses.KINDS
Use = uses.Use

_IN_GRAPH = "replicator.engines.in_graph."
_STRATEGY = "replicator.engines.strategy."
_BETWEEN = "replicator.collectives.between_workers"
_REDUCTIONS = "replicator.collectives.reductions"
_IN_GRAPH_COLLECTIVES = "replicator.collectives.in_graph"
_REPLICA_CONTEXT = "replicator.collectives.replica_context"
_CREATION = _IN_GRAPH + "creation"
_LIFTING = "replicator.variables.lifting"
_VARIABLES = "replicator.variables.replicated"
_EFFECTS = _IN_GRAPH + "effects"
_STEPS = _IN_GRAPH + "steps"
_GENERATORS = _IN_GRAPH + "generators"
_STEP_CHECKS = "replicator.engines.step_checks"
_STEP_ARGS = "replicator.engines.step_args"
_S_VARIABLES = _STRATEGY + "variables"
_S_STEPS = _STRATEGY + "steps"
_CLUSTER = "replicator.multiworker.cluster"
_LIVENESS = "replicator.multiworker.liveness"
_FETCH = "replicator.inputs.fetch"
_AUTOGRAPH_RULES = "replicator.patches.autograph_rules"
_NESTED = "replicator.patches.nested_functions"
_KERAS_COMPAT = "replicator.patches.keras_compat"

_PY = "tensorflow.python."
_CONTEXT = _PY + "eager.context"
_RESOURCE_VARIABLES = _PY + "ops.resource_variable_ops"
_TRACKABLE = _PY + "trackable.base"
_OPS = _PY + "framework.ops"
_MIRRORED = _PY + "distribute.mirrored_strategy"
_BATCH_NORM = "sonnet.src.batch_norm"

_INITIAL_VALUES = (
    "A variable that step_fn makes in its first trace gets the value computed "
    "there: its ops are copied out of the trace to run once before the step.")
_COPY = ("ReplicatedVariable answers with its first copy's, as TensorFlow asks "
         "it of any variable")
_BN = ("CrossReplicaBatchNorm (an snt.BatchNorm) normalizes over the global batch "
       "with the layer's own settings, which Sonnet keeps in private attributes")
_CHECKPOINTS = ("How a checkpoint saves and restores one of replicator's objects "
                "(a replicated variable as one value; a generator's streams)")

USES = (
    # Collectives.
    Use(_PY + "ops.collective_ops", "all_reduce_v2", "function",
        parameters=("t", "group_size", "group_key", "instance_key", "merge_op",
                    "final_op", "communication_hint", "timeout", "ordering_token"),
        why="The sum between workers over gRPC, as MultiWorkerMirroredStrategy's, "
        "with replicator's own keys and ordering tokens.", used_in=(_BETWEEN,)),
    Use(_PY + "ops.collective_ops", "all_gather_v2", "function",
        parameters=("t", "group_size", "group_key", "instance_key",
                    "communication_hint", "timeout"),
        why="The gather between workers over gRPC.", used_in=(_BETWEEN,)),
    Use(_PY + "ops.collective_ops", "broadcast_send_v2", "function",
        parameters=("t", "group_size", "group_key", "instance_key",
                    "communication_hint", "timeout"),
        why="The chief's initial values to every worker, bit for bit.", used_in=(_BETWEEN,)),
    Use(_PY + "ops.collective_ops", "broadcast_recv_v2", "function",
        parameters=("shape", "dtype", "group_size", "group_key", "instance_key",
                    "communication_hint", "timeout"),
        why="The other workers' side of that broadcast.", used_in=(_BETWEEN,)),
    Use(_PY + "ops.nccl_ops", "all_sum", "function", parameters=("tensors",),
        why="NCCL's sum over the local GPUs.", used_in=(_REDUCTIONS,)),
    Use(_PY + "ops.gen_resource_variable_ops", "var_handle_op", "function",
        parameters=("dtype", "shape", "shared_name"),
        why="A handle that nothing reads: the ordering token of a lane of collectives.",
        used_in=(_REDUCTIONS,)),
    Use(_PY + "eager.record", "record_operation", "function",
        parameters=("op_type", "output_tensors", "input_tensors", "backward_function",
                    "forward_function"),
        why="Puts a gradient on the tape where the ops have none: a collective's, "
        "and a loaded function's capture of a replicated variable.",
        used_in=(_IN_GRAPH_COLLECTIVES, _VARIABLES)),
    Use("tensorflow", "__internal__.FuncGraph", "class",
        why="Tells a tf.function's graph from a tf.cond's or tf.while_loop's "
        "(subclasses): a collective inside one is refused.", used_in=(_REPLICA_CONTEXT,)),
    Use(_OPS, "Graph._variable_creator_stack", "attribute",
        why="Variable creators are per thread: each replica's thread starts with the "
        "tracing thread's (read and set).", used_in=(_REPLICA_CONTEXT,)),
    # The in-graph engine.
    Use(_PY + "eager.polymorphic_function.concrete_function", "ConcreteFunction._call_flat",
        "method", parameters=("tensor_inputs", "captured_inputs"),
        why="Calls a step's concrete function with its flat inputs, without "
        "tf.function's dispatch, which costs as much as a small step.",
        used_in=("replicator.engines.calls",)),
    Use(_OPS, "Operation._add_control_inputs", "method",
        why="Makes an op with effects wait for the step's gate, and puts back the "
        "orderings an initial value keeps.", used_in=(_EFFECTS, _LIFTING)),
    Use(_OPS, "Operation._remove_all_control_inputs", "method",
        why="An initial value copied out of the trace drops the orderings on ops "
        "that ran before it in the step.", used_in=(_LIFTING,)),
    Use(_PY + "ops.summary_ops_v2", "_summary_state", "attribute",
        reads=("writer", "step", "is_recording", "is_recording_distribution_strategy"),
        why="The default summary writer is per thread: each replica's thread gets "
        "the tracing thread's, and only replica 0 records.", used_in=(_EFFECTS,)),
    Use(_PY + "framework.op_def_registry", "get", "function", parameters=("name",),
        why="Whether an op type draws random numbers (a seed2).", used_in=(_EFFECTS,)),
    Use(_CONTEXT, "context", "function",
        why="TensorFlow's context object: function call options, collectives "
        "between workers, peers' health.", used_in=(_LIFTING, _CLUSTER, _LIVENESS)),
    Use(_CONTEXT, "Context.function_call_options", "attribute", used_in=(_LIFTING,),
        why="The initializers' function runs without Grappler (read and set)."),
    Use(_CONTEXT, "FunctionCallOptions", "class",
        parameters=("executor_type", "config_proto"),
        reads=("executor_type", "config_proto_serialized"),
        why="The options of the initializers' function.", used_in=(_LIFTING,)),
    Use("tensorflow.core.protobuf.config_pb2", "ConfigProto", "class",
        parameters=("device_count", "graph_options", "experimental"),
        why="Session options: Grappler off (initializers); the server's logical "
        "CPUs and collective group leader.", used_in=(_LIFTING, _CLUSTER)),
    Use(_PY + "eager.lift_to_graph", "lift_to_graph", "function",
        parameters=("tensors", "graph", "disallowed_placeholders", "handle_captures",
                    "op_map"),
        why=_INITIAL_VALUES, used_in=(_LIFTING,)),
    Use(_PY + "util.object_identity", "ObjectIdentityDictionary", "class",
        why=_INITIAL_VALUES + " Each op and tensor of the trace maps to its copy "
        "(lift_to_graph's op_map; a graph tensor is not hashable).",
        used_in=(_LIFTING,)),
    Use(_PY + "ops.op_selector", "map_subgraph", "function",
        parameters=("init_tensor", "sources", "disallowed_placeholders", "visited_ops",
                    "op_outputs", "add_sources"),
        why=_INITIAL_VALUES + " These are the ops.", used_in=(_LIFTING,)),
    Use(_PY + "ops.op_selector", "UnliftableError", "class",
        why="An initial value that depends on the step's input (an error that "
        "says so).", used_in=(_LIFTING, _STEPS, _S_STEPS)),
    Use(_TRACKABLE, "CheckpointInitialValue", "class",
        why="A variable restored as it is made is not lifted.", used_in=(_LIFTING,)),
    Use(_TRACKABLE, "CheckpointInitialValueCallable", "class",
        why="A checkpoint's deferred value is not lifted.", used_in=(_LIFTING,)),
    Use(_TRACKABLE, "VARIABLE_VALUE_KEY", "attribute", why=_CHECKPOINTS + ".",
        used_in=(_VARIABLES, _S_VARIABLES)),
    Use(_TRACKABLE, "Trackable._serialize_to_tensors", "method", parameters=(),
        why=_CHECKPOINTS + ": they define it.",
        used_in=(_VARIABLES, _GENERATORS, _S_VARIABLES)),
    Use(_TRACKABLE, "Trackable._restore_from_tensors", "method",
        parameters=("restored_tensors",), why=_CHECKPOINTS + ": they define it.",
        used_in=(_VARIABLES, _GENERATORS, _S_VARIABLES)),
    Use("tensorflow", "__internal__.tracking.Trackable", "class", used_in=(_GENERATORS,),
        why="ReplicaGenerator is one, so that checkpoints hold its streams."),
    Use(_RESOURCE_VARIABLES, "UninitializedVariable", "class",
        parameters=("trainable", "caching_device", "name", "shape", "dtype",
                    "constraint", "synchronization", "aggregation", "extra_handle_data"),
        why="A variable's copies, made before their value is known (it is "
        "assigned once computed).", used_in=(_CREATION, _VARIABLES)),
    Use(_RESOURCE_VARIABLES, "ResourceVariable", "class",
        parameters=("initial_value", "trainable", "name", "dtype", "shape"),
        why="A plain variable outside every creator scope: a replica's copy, the "
        "stop flag.", used_in=(_VARIABLES, _IN_GRAPH + "interrupts")),
    Use(_RESOURCE_VARIABLES, "var_is_initialized_op", "function", parameters=("resource",),
        why="Which copies still need their value.",
        used_in=(_CREATION, _VARIABLES, "replicator.multiworker.peers")),
    Use(_RESOURCE_VARIABLES, "VariableSpec", "class", reads=("to_tensors", "cast"),
        why="A ReplicatedVariable passed to a tf.function goes in as its current "
        "copy (a subclass overrides these).", used_in=(_VARIABLES,)),
    Use(_RESOURCE_VARIABLES, "write_object_proto_for_resource_variable", "function",
        parameters=("resource_variable", "proto", "options"),
        why="A SavedModel holds a ReplicatedVariable as one plain variable.",
        used_in=(_VARIABLES,)),
    Use(_RESOURCE_VARIABLES, "_should_act_as_resource_variable", "protocol",
        looked_up_by="is_resource_variable",
        why="ReplicatedVariable defines it, so that TensorFlow takes it for a "
        "resource variable.", used_in=(_VARIABLES,)),
    Use(_RESOURCE_VARIABLES, "BaseResourceVariable._dense_var_to_tensor", "method",
        parameters=("dtype", "name", "as_ref"),
        why="A ReplicatedVariable converts to a tensor as the current replica's copy "
        "does.", used_in=(_VARIABLES,)),
    Use(_RESOURCE_VARIABLES, "BaseResourceVariable._strided_slice_assign", "method",
        parameters=("begin", "end", "strides", "value", "name", "begin_mask", "end_mask",
                    "ellipsis_mask", "new_axis_mask", "shrink_axis_mask"),
        why="`var[...].assign(x)` calls it: both engines' variables merge the "
        "value over the replicas first.", used_in=(_VARIABLES, _S_VARIABLES)),
    Use(_RESOURCE_VARIABLES, "BaseResourceVariable._export_to_saved_model_graph",
        "method", parameters=("object_map", "tensor_map", "options", "**"),
        why="A SavedModel holds a ReplicatedVariable as its first copy.",
        used_in=(_VARIABLES,)),
    Use(_RESOURCE_VARIABLES, "BaseResourceVariable._unique_id", "instance attribute",
        why=_COPY + ".", used_in=(_VARIABLES,)),
    Use(_RESOURCE_VARIABLES, "BaseResourceVariable._in_graph_mode",
        "instance attribute", why=_COPY + ".", used_in=(_VARIABLES,)),
    Use(_PY + "ops.variables", "Variable._shared_name", "attribute", why=_COPY + ".",
        used_in=(_VARIABLES,)),
    Use(_PY + "saved_model.save", "_write_object_proto", "protocol",
        why="ReplicatedVariable defines it: a SavedModel holds it as one plain "
        "variable.", used_in=(_VARIABLES,)),
    Use(_PY + "saved_model.load", "is_distributed_variable", "protocol",
        why="ReplicatedVariable sets it, so that a loaded function binds its capture "
        "of the variable to the variable, and each replica reads its copy.",
        used_in=(_VARIABLES,)),
    Use(_PY + "framework.tensor_conversion_registry",
        "register_tensor_conversion_function", "function",
        parameters=("base_type", "conversion_func"),
        why="tf.convert_to_tensor of a ReplicatedVariable reads the current copy.",
        used_in=(_VARIABLES,)),
    Use(_PY + "types.core", "Tensor", "class",
        why="ReplicatedVariable is one, as tf.Variable is, so tf.is_tensor is true "
        "for it.", used_in=(_VARIABLES,)),
    Use(_PY + "framework.func_graph", "FuncGraph._watched_variables", "instance attribute",
        why="The variables a step uses: each must be a replica's copy.",
        used_in=(_STEP_CHECKS,)),
    Use(_PY + "util.nest", "flatten_with_joined_string_paths", "function",
        parameters=("structure",),
        why="Names the input element's leaf that has no batch dimension.",
        used_in=(_STEP_CHECKS,)),
    Use(_PY + "data.ops.optional_ops", "Optional._type_spec", "attribute", used_in=(_STEPS,),
        why="The shape invariant of the loop's optionals (the next step's batches)."),
    Use("tensorflow", "__internal__.autograph.tf_convert", "function",
        parameters=("f", "ctx"),
        why="step_fn converted by AutoGraph as tf.function would convert it.",
        used_in=(_STEP_ARGS,)),
    Use("tensorflow", "__internal__.autograph.control_status_ctx", "function",
        why="The AutoGraph status that tf_convert takes.", used_in=(_STEP_ARGS,)),
    Use(_PY + "ops.ragged.ragged_tensor", "RaggedTensor._set_shape", "method",
        parameters=("shape",),
        why="A ragged batch keeps the static dims every worker agreed on.",
        used_in=(_FETCH,)),
    # The strategy engine, the TPU stand-in and the fake TPU.
    Use(_PY + "distribute.values", "DistributedVariable._primary", "attribute",
        why="A checkpoint saves the first copy's value.", used_in=(_S_VARIABLES,)),
    Use(_PY + "distribute.values", "DistributedVariable._use_packed_variable", "method",
        why="Overridden: a trace of step_fn alone reads each copy as itself, so "
        "gradients reach it.", used_in=(_S_VARIABLES,)),
    Use(_PY + "ops.tensor_getitem_override", "_slice_helper_var", "function",
        parameters=("var", "slice_spec"),
        why="A strategy variable's slice whose assign merges over replicas.",
        used_in=(_S_VARIABLES,)),
    Use(_PY + "framework.auto_control_deps", "AutomaticControlDependencies", "class",
        why="A trace of step_fn alone gets a tf.function's orderings of stateful "
        "ops, which the lifting of initial values reads.", used_in=(_S_STEPS,)),
    Use(_PY + "framework.func_graph", "FuncGraph", "class", parameters=("name",),
        why="The graph of a trace of step_fn alone (variables, output specs).",
        used_in=(_S_STEPS,)),
    Use(_MIRRORED, "MirroredStrategy._collective_key_base", "attribute",
        why="The TPU stand-in's collective group keys differ from any other "
        "MirroredStrategy's (set per instance).", used_in=("replicator.tpu",)),
    Use(_MIRRORED, "MirroredExtended._use_var_policy", "instance attribute",
        why="The TPU stand-in makes variables with policies, as TPUStrategy does (set).",
        used_in=("replicator.tpu",)),
    Use(_MIRRORED, "MirroredExtended._use_merge_call", "method",
        why="The TPU stand-in sums in the replica's context, as a TPU does (replaced "
        "per instance).", used_in=("replicator.tpu",)),
    Use(_PY + "client.session", "_DeviceAttributes", "class",
        parameters=("name", "device_type", "memory_limit_bytes", "incarnation"),
        why="The fake TPU's devices.", used_in=("replicator.testing",)),
    Use(_PY + "tpu.topology", "Topology", "class",
        parameters=("mesh_shape", "device_coordinates"),
        why="The fake TPU's topology.", used_in=("replicator.testing",)),
    Use(_PY + "tpu.tpu_system_metadata", "TPUSystemMetadata", "class",
        parameters=("num_cores", "num_hosts", "num_of_cores_per_host", "topology",
                    "devices"),
        why="What the fake TPU's resolver answers TPUStrategy.",
        used_in=("replicator.testing",)),
    # Workers.
    Use(_CONTEXT, "Context._collective_ops_server_def", "instance attribute",
        why="Whether MultiWorkerMirroredStrategy started this process's server: a "
        "replicator then joins it.", used_in=(_CLUSTER,)),
    Use(_CONTEXT, "Context._context_handle", "instance attribute",
        why="Whether TensorFlow ran an op already (too late to join a cluster).",
        used_in=(_CLUSTER,)),
    Use(_CONTEXT, "Context.configure_collective_ops", "method",
        parameters=("collective_leader", "scoped_allocator_enabled_ops",
                    "device_filters"),
        why="Collectives configured as MultiWorkerMirroredStrategy configures them.",
        used_in=(_CLUSTER,)),
    Use(_CONTEXT, "Context.enable_collective_ops", "method", parameters=("server_def",),
        why="Starts the worker's server.", used_in=(_CLUSTER,)),
    Use(_CONTEXT, "Context.ensure_initialized", "method", used_in=(_CLUSTER,),
        why="Starts the worker's server now, where its error can be explained."),
    Use("tensorflow.core.protobuf.tensorflow_server_pb2", "ServerDef", "class",
        parameters=("cluster", "job_name", "task_index", "protocol",
                    "default_session_config"),
        why="The worker's server (and the one a strategy started, compared).",
        used_in=(_CLUSTER,)),
    Use(_CONTEXT, "Context.check_collective_ops_peer_health", "method",
        parameters=("task", "timeout_in_ms"),
        why="Whether a peer answers (the heartbeat; who a WorkerLost names).",
        used_in=(_LIVENESS,)),
    Use(_CONTEXT, "Context.abort_collective_ops", "method", parameters=("code", "message"),
        why="A lost peer ends the collectives waiting for it.", used_in=(_LIVENESS,)),
    # Checkpoints.
    Use("tensorflow.core.protobuf.trackable_object_graph_pb2", "TrackableObjectGraph",
        "class", parameters=("nodes",),
        why="The names a checkpoint holds, to check them against the trackables "
        "given.", used_in=("replicator.checkpoint",)),
    Use(_PY + "checkpoint.functional_saver", "_temp", "protocol",
        why="The writer puts a checkpoint's shards in `<prefix>_temp/` first: the "
        "clean-up after a save removes what a crash left there.",
        used_in=("replicator.checkpoint_files",)),
    Use(_TRACKABLE, "OBJECT_GRAPH_PROTO_KEY", "attribute",
        text="_CHECKPOINTABLE_OBJECT_GRAPH", why="The checkpoint key of that graph.",
        used_in=("replicator.checkpoint",)),
    # The patches' own.
    Use(_PY + "autograph.core.config", "DoNotConvert", "class",
        parameters=("module_prefix",),
        why="AutoGraph's rule for a module run as written.", used_in=(_AUTOGRAPH_RULES,)),
    Use(_PY + "autograph.core.config", "DoNotConvert._prefix", "instance attribute",
        why="A reloaded autograph_rules finds its rule there, not adding it twice.",
        used_in=(_AUTOGRAPH_RULES,)),
    Use(_PY + "autograph.core.converter", "ConversionOptions", "class",
        parameters=("recursive", "user_requested", "optional_features"),
        why="A tf.function that step_fn calls is converted inline as tf.function "
        "converts it.", used_in=(_NESTED,)),
    Use(_PY + "autograph.impl.api", "converted_call", "function",
        parameters=("f", "args", "kwargs", "options"),
        why="The inline call of that tf.function.", used_in=(_NESTED,)),
    Use(_PY + "ops.stateful_random_ops", "Generator._distribution_strategy",
        "instance attribute",
        why="A generator made in a strategy's scope draws per replica.",
        used_in=("replicator.patches.randomness",)),
    Use("keras.src.backend.common.variables", "Variable._value", "instance attribute",
        why="The TensorFlow variable a Keras 3 variable wraps: ours, in a "
        "replicator's context.",
        used_in=("replicator.optimizers", "replicator.checkpoint", _KERAS_COMPAT),
        known_for=_KERAS),
    Use("keras.src.optimizers.base_optimizer", "BaseOptimizer._trainable_variables",
        "instance attribute",
        why="A wrapped Keras optimizer's apply(grads) without its variables.",
        used_in=("replicator.optimizers",), known_for=_KERAS),
    Use("keras.src.backend.tensorflow.optimizer", "extended.update", "protocol",
        looked_up_by="TFOptimizer",
        why="The wrapped optimizer's update gets a strategy whose "
        "extended.update writes the replica's own copy.",
        used_in=(_KERAS_COMPAT,), known_for=_KERAS),
    # Sonnet's.
    Use(_BATCH_NORM, "BaseBatchNorm._initialize", "method", parameters=("inputs",),
        why=_BN + "; it overrides this one.", used_in=("replicator.nn",),
        known_for=_SONNET),
    *(Use(_BATCH_NORM, f"BaseBatchNorm.{name}", "instance attribute", why=_BN + ".",
          used_in=("replicator.nn",), known_for=_SONNET)
      for name in ("_axis", "_channel_index", "_create_scale", "_create_offset",
                   "_eps", "_fused")),
    *(Use(module, "", "module", used_in=(_AUTOGRAPH_RULES,), known_for=_SONNET,
          why="Run as written in a step's trace (AutoGraph's rules name it).")
      for module in autograph_rules.SONNET_AS_WRITTEN),
)
