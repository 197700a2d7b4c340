"""Gradient compression for the binding: Horovod's interface (static ``compress`` and
``decompress``), without importing TensorFlow until a tensor is compressed."""

from __future__ import annotations


class Compressor:
    """Interface for compressing and decompressing a tensor (Horovod's ``Compressor``)."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression (the default)."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Send floating-point tensors as float16 and cast back afterwards."""

    @staticmethod
    def compress(tensor):
        import tensorflow as tf

        if tensor.dtype.is_floating:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        import tensorflow as tf

        if ctx is not None and ctx.is_floating:
            return tf.cast(tensor, ctx)
        return tensor


class Compression:
    """Gradient compression used during allreduce: ``Compression.none`` or ``Compression.fp16``.

    Horovod's own ``horovod.tensorflow.Compression`` values are accepted too.
    """

    none = NoneCompressor
    fp16 = FP16Compressor
