"""Where TensorFlow, Keras and AutoGraph need changing to be replica-aware.

`registry` lists every private name patched, why, by which module, and for
which versions; it installs them while a step is traced (`while_tracing`).
`private_names` lists the private names used as they are, and `error_texts`
the words of TensorFlow's errors that replicator matches.
- `autograph_rules`: what AutoGraph converts while a step is traced.
- `nested_functions`: a `tf.function` that `step_fn` calls, traced per replica.
- `randomness`: every replica draws its own random numbers.
- `keras_compat`: Keras 3's seeds, `assign_add`, synchronized batch norm.
"""
