"""Where TensorFlow, Keras and AutoGraph need changing to be replica-aware.

`registry` lists and installs the patches, which the other modules write;
`private_names` and `error_texts` list the private names and the error words
that replicator uses as they are.
"""
