"""Keras models exported to ONNX by tf2onnx, for benchmarks/tf2onnx_zoo.py. Runs in an environment
with TensorFlow, tf-keras and tf2onnx (not korch's: `python -m venv ENV && ENV/bin/pip install
tensorflow-cpu tf-keras tf2onnx`): `ENV/bin/python benchmarks/keras_export.py DIR NAME ...` writes
DIR/NAME.onnx (batch 1, opset 17, random weights seeded by TensorFlow) and prints `ok NAME` or
`fail NAME: why` per model. NAME is a `keras.applications` class (MobileNetV2, ResNet50, ...) or
one of the small models below (layers the applications lack: recurrent, attention, 1-D
convolutions, transposed convolutions, upsampling).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf2onnx's from_keras takes Keras 2 models

import tensorflow as tf  # noqa: E402
import tf2onnx  # noqa: E402
import tf_keras as keras  # noqa: E402

L = keras.layers


def text_lstm():
    """Embedding, a bidirectional LSTM, a GRU (ONNX's LSTM and GRU operators)."""
    x = keras.Input((32,), dtype="int32", batch_size=1)
    h = L.Embedding(1000, 64)(x)
    h = L.Bidirectional(L.LSTM(64, return_sequences=True))(h)
    h = L.GRU(32)(h)
    return keras.Model(x, L.Dense(5, activation="softmax")(h))


def text_transformer():
    """Two post-norm encoder layers of Keras' MultiHeadAttention (tanh GELU: tf2onnx has no Erfc)."""
    x = keras.Input((64,), dtype="int32", batch_size=1)
    h = L.Embedding(1000, 128)(x)
    for _ in range(2):
        h = L.LayerNormalization()(h + L.MultiHeadAttention(4, 32)(h, h))
        f = L.Dense(512, activation=lambda t: tf.nn.gelu(t, approximate=True))(h)
        h = L.LayerNormalization()(h + L.Dense(128)(f))
    return keras.Model(x, L.Dense(2)(L.GlobalAveragePooling1D()(h)))


def conv1d():
    """1-D convolutions: causal dilated separable, transposed, upsampling by repetition."""
    x = keras.Input((128, 16), batch_size=1)
    h = L.Conv1D(32, 5, padding="same", activation="relu")(x)
    h = L.MaxPooling1D(2)(L.BatchNormalization()(h))
    h = L.SeparableConv1D(64, 3, dilation_rate=2, padding="causal", activation="swish")(h)
    h = L.Conv1DTranspose(16, 3, strides=2, padding="same")(L.UpSampling1D(2)(h))
    return keras.Model(x, L.GlobalMaxPooling1D()(h))


def unet():
    """A small U-Net: a skip connection, transposed convolution, bilinear upsampling."""
    x = keras.Input((64, 64, 3), batch_size=1)
    c1 = L.Conv2D(16, 3, padding="same", activation="relu")(x)
    c2 = L.Conv2D(32, 3, padding="same", activation="elu")(L.MaxPooling2D()(c1))
    c2 = L.DepthwiseConv2D(3, padding="same")(c2)
    h = L.Concatenate()([L.Conv2DTranspose(16, 2, strides=2)(c2), c1])
    h = L.LeakyReLU(0.1)(L.BatchNormalization()(L.Conv2D(16, 3, padding="same")(h)))
    h = L.AveragePooling2D(2)(L.UpSampling2D(2, interpolation="bilinear")(h))
    return keras.Model(x, L.Conv2D(2, 1, activation="softmax")(h))


SMALL = {"text-lstm": text_lstm, "text-transformer": text_transformer, "conv1d": conv1d, "unet": unet}


def build(name: str):
    if name in SMALL:
        return SMALL[name]()
    model = getattr(keras.applications, name)(weights=None)
    if None in model.input_shape[1:]:  # (MobileNetV3 takes any image size)
        x = keras.Input((224, 224, 3), batch_size=1)
        model = keras.Model(x, model(x))
    return model


def main() -> None:
    out, names = sys.argv[1], sys.argv[2:]
    for name in names:
        tf.random.set_seed(0)
        try:
            model = build(name)
            spec = tuple(tf.TensorSpec((1, *i.shape[1:]), i.dtype, name=i.name) for i in model.inputs)
            path = f"{out}/{name}.onnx"
            tf2onnx.convert.from_keras(model, input_signature=spec, opset=17, output_path=path)
            print(f"ok {name}", flush=True)
        except Exception as e:  # (tf2onnx's failures are not korch's: reported, then the next)
            print(f"fail {name}: {str(e).splitlines()[0][:120] if str(e) else type(e).__name__}", flush=True)


if __name__ == "__main__":
    main()
