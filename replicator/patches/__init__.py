"""Where TensorFlow, Keras and AutoGraph need changing to be replica-aware.

- `autograph_rules`: what AutoGraph converts while a step is traced.
- `nested_functions`: a `tf.function` that `step_fn` calls, traced per replica.
- `randomness`: every replica draws its own random numbers.
- `keras_compat`: Keras 3's seeds, `assign_add`, synchronized batch norm.
"""
