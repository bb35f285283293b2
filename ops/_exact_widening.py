"""Float32 values that are exactly half-precision ones, moved and read as half precision.

Under mixed precision a float32 variable's gradient is a bfloat16 (or float16) gradient cast
to float32: the cast's gradient. Every value is exactly a half-precision one, so sent as that
half-precision tensor it moves half the bytes and loses nothing; widened where it is added,
its sum is the float32 sum of the float32 gradients, bit for bit, wherever each element's sum
is one addition (two towers). `narrow_form` finds the half-precision tensor behind a float32
one. A compiled tower's program hides its casts, so on two towers it returns such a gradient
in half precision and casts it outside (`towers.step._tower_gradients`), where this finds it.
"""

from towers.ops._tensorflow import tf

HALF = (tf.bfloat16, tf.float16)


def narrow_form(tensor: object) -> tf.Tensor | None:
    """The half-precision tensor a float32 `tensor` is exactly the widening of, else None.

    Args:
      tensor: Anything; only a graph's float32 tensor made by a cast from bfloat16 or float16
        (with no control dependencies of its own, which using its input would drop) has one.

    Returns:
      The cast's bfloat16 or float16 input, or None.
    """
    if not isinstance(tensor, tf.Tensor) or tf.executing_eagerly():
        return None
    op = tensor.op
    if tensor.dtype != tf.float32 or op.type != "Cast" or op.control_inputs:
        return None
    return op.inputs[0] if op.inputs[0].dtype in HALF else None


def narrowest(tensor: object) -> object:
    """`tensor`'s narrow form (`narrow_form`) where it has one, else `tensor` itself.

    For what only reads the values' finiteness or widens them again where it reads them:
    half the bytes, and the cast need not run.
    """
    form = narrow_form(tensor)
    return tensor if form is None else form


def narrow_columns(columns: list[list[tf.Tensor]]) -> list[list[tf.Tensor]]:
    """Columns of K tensors, each as its narrow forms when all K have one of one dtype."""
    out = []
    for column in columns:
        forms = [narrow_form(t) for t in column]
        same = all(f is not None for f in forms) and len({f.dtype for f in forms}) == 1
        out.append(forms if same else list(column))
    return out
