"""A catalogue of Sonnet and Keras modules ("goldens"), as Sonnet's conformance tests keep.

Each golden builds a module with seeded initializers (so two builds start equal), a
batch of inputs, and the module's output as a float tensor. Modules whose output
depends on the batch (batch norm) or on randomness (dropout) are tested elsewhere.
"""

import dataclasses
from typing import Callable

import keras
import numpy as np
import sonnet as snt
import tensorflow as tf


def _vs(seed):
  return snt.initializers.VarianceScaling(seed=seed)


def _glorot(seed):
  return keras.initializers.GlorotUniform(seed=seed)


@dataclasses.dataclass(frozen=True)
class Golden:
  name: str
  make: Callable[[], Callable]  # -> module
  inputs: Callable[[int], np.ndarray]  # global batch -> inputs
  forward: Callable = lambda module, x: module(x)


def _images(batch, size=6, channels=3):
  return np.random.RandomState(0).randn(batch, size, size, channels).astype(np.float32)


def _vectors(batch, features=5):
  return np.random.RandomState(0).randn(batch, features).astype(np.float32)


def _sequences(batch, steps=4, features=3):
  return np.random.RandomState(0).randn(batch, steps, features).astype(np.float32)


def _tokens(batch, length=3, vocab=7):
  return np.random.RandomState(0).randint(0, vocab, [batch, length]).astype(np.int32)


def _unrolled(core, x):
  """A recurrent core over batch-major `x` (time-major inside)."""
  outputs, _ = snt.dynamic_unroll(core, tf.transpose(x, [1, 0, 2]),
                                  core.initial_state(x.shape[0]))
  return outputs


class DecoratedCall(snt.Module):
  """A module whose `__call__` is a `tf.function` and builds its variables on first call."""

  def __init__(self):
    super().__init__()
    self.mlp = snt.nets.MLP([6, 3], w_init=_vs(1))

  @tf.function
  def __call__(self, x):
    return self.mlp(x)


GOLDENS = [
    Golden("snt.Linear", lambda: snt.Linear(3, w_init=_vs(1), b_init=_vs(2)), _vectors),
    Golden("snt.nets.MLP", lambda: snt.nets.MLP([6, 3], w_init=_vs(1), b_init=_vs(2)),
           _vectors),
    Golden("tf.function __call__", DecoratedCall, _vectors),
    Golden("snt.Conv1D", lambda: snt.Conv1D(4, 3, w_init=_vs(1)), _sequences),
    Golden("snt.Conv2D", lambda: snt.Conv2D(4, 3, stride=2, w_init=_vs(1)), _images),
    Golden("snt.Conv2DTranspose", lambda: snt.Conv2DTranspose(2, 3, stride=2, w_init=_vs(1)),
           _images),
    Golden("snt.DepthwiseConv2D", lambda: snt.DepthwiseConv2D(3, 2, w_init=_vs(1)), _images),
    Golden("snt.LayerNorm", lambda: snt.Sequential([
        snt.Linear(4, w_init=_vs(1)),
        snt.LayerNorm(-1, create_scale=True, create_offset=True)]), _vectors),
    Golden("snt.GroupNorm", lambda: snt.Sequential([
        snt.Conv2D(4, 3, w_init=_vs(1)), snt.GroupNorm(2)]), _images),
    # Embed creates its table eagerly, where a seeded stateful initializer draws new
    # numbers on each call: the table comes from NumPy instead.
    Golden("snt.Embed", lambda: snt.Embed(
        existing_vocab=np.random.RandomState(1).randn(7, 4).astype(np.float32)), _tokens),
    Golden("snt.LSTM", lambda: snt.LSTM(4, w_i_init=_vs(1), w_h_init=_vs(2)), _sequences,
           _unrolled),
    Golden("snt.GRU", lambda: snt.GRU(4, w_i_init=_vs(1), w_h_init=_vs(2)), _sequences,
           _unrolled),
    Golden("snt.VanillaRNN", lambda: snt.VanillaRNN(4, w_i_init=_vs(1), w_h_init=_vs(2)),
           _sequences, _unrolled),
    # Its step is a tf.function with `experimental_attributes` taking the weights as
    # arguments. (It trains differently with and without XLA in plain Sonnet too.)
    Golden("snt.UnrolledLSTM", lambda: snt.UnrolledLSTM(4, w_i_init=_vs(1), w_h_init=_vs(2)),
           _sequences, lambda module, x: module(
               tf.transpose(x, [1, 0, 2]), module.initial_state(x.shape[0]))[0]),
    Golden("keras.layers.Dense", lambda: keras.layers.Dense(3, kernel_initializer=_glorot(1)),
           _vectors),
    Golden("keras.layers.Conv2D", lambda: keras.layers.Conv2D(
        4, 3, strides=2, kernel_initializer=_glorot(1)), _images),
    Golden("keras.layers.Embedding", lambda: keras.layers.Embedding(
        7, 4, embeddings_initializer=keras.initializers.RandomNormal(seed=1)), _tokens),
    Golden("keras.layers.LayerNormalization", lambda: keras.Sequential([
        keras.layers.Dense(4, kernel_initializer=_glorot(1)),
        keras.layers.LayerNormalization()]), _vectors),
    Golden("keras.layers.LSTM", lambda: keras.layers.LSTM(
        4, return_sequences=True, kernel_initializer=_glorot(1),
        recurrent_initializer=keras.initializers.Orthogonal(seed=2)), _sequences),
    Golden("keras.layers.MultiHeadAttention", lambda: keras.layers.MultiHeadAttention(
        2, 3, kernel_initializer=_glorot(1)), _sequences,
           lambda module, x: module(x, x)),
]
