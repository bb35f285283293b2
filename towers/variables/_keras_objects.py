"""Keras layers and models as building blocks, recognized by what they provide (no Keras import).

Keras 3 (the Keras of TensorFlow 2.16+) and `tf_keras` layers hold their variables in their
own way: Keras 3 wraps each `tf.Variable` in a `keras.Variable` and is no `tf.Module`, so a
`tf.Module` holding one sees none of its variables; `tf_keras` layers are `tf.Module`s whose
attributes are bookkeeping. Both are walked here by their public face instead: sub-layers
held in public attributes or in `layers`, then the layer's remaining `variables` by their
short names ("kernel"). Names therefore follow the model's structure
("encoder/layers/0/kernel"), never the auto-numbered names Keras gives ("dense_7"), which
depend on how many layers the process made before.
"""

from typing import Any

import tensorflow as tf


def is_keras_layer(obj: Any) -> bool:
    """Whether `obj` is a Keras layer or model (Keras 3 or `tf_keras`), by what it provides."""
    return (
        not isinstance(obj, type)
        and callable(getattr(obj, "add_weight", None))
        and hasattr(obj, "trainable_variables")
        and hasattr(obj, "non_trainable_variables")
    )


def is_keras_variable(obj: Any) -> bool:
    """Whether `obj` is a `keras.Variable` wrapping a `tf.Variable` (Keras 3 on TensorFlow)."""
    return (
        not isinstance(obj, tf.Variable)
        and hasattr(obj, "path")
        and hasattr(obj, "trainable")
        and isinstance(getattr(obj, "value", None), tf.Variable)
    )


def as_tf_variable(var: Any) -> tf.Variable:
    """The `tf.Variable` behind a variable: itself, or what a `keras.Variable` wraps.

    Raises:
      TypeError: if `var` is neither (e.g. a Keras variable of another backend).
    """
    if isinstance(var, tf.Variable):
        return var
    value = getattr(var, "value", None)
    if isinstance(value, tf.Variable):
        return value
    raise TypeError(
        f"Expected a tf.Variable or a Keras variable holding one; got {type(var).__name__} "
        f"{getattr(var, 'path', var)!r}. Keras must run on the TensorFlow backend "
        "(KERAS_BACKEND=tensorflow)."
    )


def keras_children(layer: Any) -> list[tuple[str, Any]]:
    """The parts of `layer` to walk, each with its path component, in a stable order.

    Public attributes first (sorted by name, as `tf.Module` walks them), then the `layers`
    list of a model (`layers/0`, `layers/1`...) when it has one.
    """
    children = [(key, value) for key, value in sorted(vars(layer).items()) if _public(key)]
    layers = getattr(type(layer), "layers", None)
    if isinstance(layers, property):  # a model: Sequential, functional, subclassed
        children.append(("layers", list(layer.layers)))
    return children


def own_variables(layer: Any) -> list[tuple[str, tf.Variable]]:
    """Every variable of `layer` under its short name ("kernel"), in the layer's order."""
    return [(_short_name(v), as_tf_variable(v)) for v in layer.variables]


def frozen(layer: Any) -> list[tf.Variable]:
    """The variables a Keras layer does not train (its non-trainable state, or all if frozen).

    A frozen Keras 3 layer (`layer.trainable = False`) leaves its `tf.Variable`s marked
    trainable; the layer's own lists are what count.
    """
    return [as_tf_variable(v) for v in layer.non_trainable_variables]


def _public(key: str) -> bool:
    return not key.startswith("_") and key not in ("layers", "built", "trainable")


def _short_name(var: Any) -> str:
    """The variable's own name ("kernel"), without scopes, ":0" or the layer's path."""
    name = getattr(var, "name", "") or "variable"
    return name.rsplit(":", 1)[0].rpartition("/")[2]
