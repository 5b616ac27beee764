"""Shapes, parameter counts and the large-batch details of the examples/resnet models."""

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import replicator
from examples.resnet import models


def _num_parameters(module):
  return sum(int(np.prod(v.shape)) for v in module.trainable_variables)


@pytest.fixture(scope="module")
def resnet50():
  model = models.ResNet50(num_classes=1000)
  # Parameter counts do not depend on the image size; 64x64 keeps the test fast.
  logits = model(tf.zeros([2, 64, 64, 3]), is_training=False)
  return model, logits


def test_resnet50_shape_and_parameter_count(resnet50):
  model, logits = resnet50
  assert logits.shape == (2, 1000) and logits.dtype == tf.float32
  # ResNet-50 v1.5 as in the reference implementations: 25.6M.
  assert _num_parameters(model) == 25_557_032
  assert len(model.blocks) == 16


def test_resnet50_downsamples_by_32(resnet50):
  model, _ = resnet50
  x = tf.nn.max_pool2d(model.stem(tf.zeros([1, 64, 64, 3]), is_training=False), 3, 2,
                       "SAME")
  assert x.shape == (1, 16, 16, 64)
  for block in model.blocks:
    x = block(x, is_training=False)
  assert x.shape == (1, 2, 2, 2048)  # 7x7 at 224x224


def test_resnet50_v1_5_strides_on_the_3x3(resnet50):
  model, _ = resnet50
  first_of_stage2 = model.blocks[3]
  a, b, c = first_of_stage2.layers
  assert (a.conv.kernel_size, a.conv.stride) == (1, 1)
  assert (b.conv.kernel_size, b.conv.stride) == (3, 2)
  assert (c.conv.kernel_size, c.conv.stride) == (1, 1)
  assert first_of_stage2.shortcut.conv.stride == 2


def test_resnet20_shapes_and_parameter_count():
  model = models.ResNet20(num_classes=10)
  assert model(tf.zeros([3, 28, 28, 1]), is_training=True).shape == (3, 10)
  assert model(tf.zeros([3, 32, 32, 1]), is_training=False).shape == (3, 10)
  # 20 weighted layers: 19 convs and the classifier (+ 2 projection shortcuts).
  convs = [m for m in model.submodules if isinstance(m, models.Conv2D)]
  assert len(convs) == 19 + 2


def test_zero_init_of_last_bn_scale_makes_blocks_identity():
  model = models.ResNet20()
  model(tf.zeros([2, 28, 28, 1]), is_training=False)
  for block in model.blocks:
    last = block.layers[-1].norm
    np.testing.assert_array_equal(last.scale.numpy(), 0.0)
    assert np.all(block.layers[0].norm.scale.numpy() == 1.0)
  # An identity block (no projection) then passes relu(x) through unchanged.
  block = model.blocks[1]
  x = tf.nn.relu(tf.random.normal([2, 28, 28, 16]))
  np.testing.assert_allclose(block(x, is_training=True).numpy(), x.numpy())


def _check_weight_decay_variables(model):
  decayed = {v.ref() for v in model.weight_decay_variables}
  kernels = [v for v in model.trainable_variables if v.shape.rank in (2, 4)]
  assert decayed == {v.ref() for v in kernels}
  others = [v.name for v in model.trainable_variables if v.ref() not in decayed]
  assert others and all(("bn" in n or n.endswith("b:0")) for n in others)


def test_weight_decay_only_on_conv_and_linear_kernels(resnet50):
  _check_weight_decay_variables(resnet50[0])
  model = models.ResNet20(num_classes=10)
  model(tf.zeros([1, 28, 28, 1]), is_training=False)
  _check_weight_decay_variables(model)


def test_bfloat16_compute_keeps_float32_variables_and_logits():
  tf.random.set_seed(0)
  images = tf.random.normal([4, 28, 28, 1])
  f32 = models.ResNet20()
  bf16 = models.ResNet20(compute_dtype=tf.bfloat16)
  f32(images, is_training=True)
  bf16(images, is_training=True)
  assert all(v.dtype in (tf.float32, tf.int64) for v in bf16.variables)
  for a, b in zip(f32.variables, bf16.variables):
    # Zero-initialised vectors (last scales, offsets) to one: every conv counts.
    b.assign(tf.ones_like(a) if a.shape.rank == 1 and not a.numpy().any() else a)
    a.assign(b)
  out32 = f32(images, is_training=True)
  out16 = bf16(images, is_training=True)
  assert out16.dtype == tf.float32
  relative_error = np.linalg.norm(out16 - out32) / np.linalg.norm(out32)
  assert 1e-5 < relative_error < 2e-2  # bfloat16 has an 8-bit mantissa


@pytest.mark.parametrize("cross_replica", [False, True])
def test_batch_norm_factory_keeps_plain_moving_averages(cross_replica):
  """Each training call moves the statistics by (1 - decay) towards the batch's
  (the unbiased variance, as snt.BatchNorm's fused kernel gives it), from 0 and
  1, with no debiasing; a call that does not train uses them."""
  norm = models.batch_norm_factory(decay_rate=0.8, cross_replica=cross_replica)(
      snt.initializers.Ones(), "bn")
  assert isinstance(norm, replicator.nn.CrossReplicaBatchNorm if cross_replica
                    else snt.BaseBatchNorm)
  rng = np.random.RandomState(0)
  batches = [(rng.randn(4, 3, 3, 2) * [1.0, 3.0] + [2.0, -1.0]).astype(np.float32)
             for _ in range(2)]
  mean, variance = np.zeros(2), np.ones(2)
  for x in batches:
    norm(tf.constant(x), is_training=True)
    mean = 0.8 * mean + 0.2 * x.mean(axis=(0, 1, 2))
    variance = 0.8 * variance + 0.2 * x.var(axis=(0, 1, 2), ddof=1)
  np.testing.assert_allclose(norm.moving_mean.value.numpy().ravel(), mean, rtol=1e-5)
  np.testing.assert_allclose(norm.moving_variance.value.numpy().ravel(), variance,
                             rtol=1e-5)
  # One variable a statistic, beside the scale and the offset.
  assert sorted(v.name for v in norm.variables) == [
      "bn/moving_mean/average:0", "bn/moving_variance/average:0", "bn/offset:0",
      "bn/scale:0"]
  x = batches[0]
  np.testing.assert_allclose(
      norm(tf.constant(x), is_training=False).numpy(),
      (x - mean) / np.sqrt(variance + 1e-5), rtol=1e-4, atol=1e-5)
  norm.moving_mean.reset()
  np.testing.assert_array_equal(norm.moving_mean.value.numpy(), 0.0)


def test_moving_average_refuses_a_decay_outside_0_to_1():
  with pytest.raises(ValueError, match=r"decay=1.5.*\[0, 1\]"):
    models.MovingAverage(decay=1.5, initial_value=0.0)


def test_keras_baseline_is_the_same_resnet20():
  from examples.resnet import keras_baseline  # pylint: disable=g-import-not-at-top
  keras_model = keras_baseline.resnet20(num_classes=10)
  model = models.ResNet20(num_classes=10)
  model(tf.zeros([1, 28, 28, 1]), is_training=False)
  assert _num_parameters(keras_model) == _num_parameters(model) == 272_186


@pytest.mark.parametrize("kernel, stride", [(3, 2), (1, 2), (3, 1)])
def test_keras_baseline_pads_convolutions_as_models_conv2d(kernel, stride):
  """Same kernel, same input: the same output (Keras' 'same' padded strided 3x3
  convolutions by (0, 1), shifting what each output sees by a pixel)."""
  from examples.resnet import keras_baseline  # pylint: disable=g-import-not-at-top
  import keras  # pylint: disable=g-import-not-at-top
  images = tf.random.stateless_normal([2, 8, 8, 3], seed=[0, 1])
  ours = models.Conv2D(4, kernel, stride)
  expected = ours(images)
  inputs = keras.Input([8, 8, 3])
  keras_model = keras.Model(inputs, keras_baseline.conv(inputs, 4, kernel, stride))
  keras_model.layers[-1].set_weights([ours.w.numpy()])
  np.testing.assert_allclose(keras_model(images).numpy(), expected.numpy(), atol=1e-5)
