"""Float32 values that are exactly half-precision ones, moved and read as half precision.

Under mixed precision a float32 variable's gradient is a bfloat16 (or float16) gradient cast
to float32: the cast's gradient. Every value is exactly a half-precision one, so sent as that
half-precision tensor it moves half the bytes and loses nothing; widened where it is added,
its sum is the float32 sum of the float32 gradients, bit for bit.

`narrow_form` finds the half-precision tensor behind a float32 one: the input of a cast in
the same graph, or one `widened` noted. A compiled program's outputs hide their ops, so a
compiled tower returns the half-precision gradient and builds the cast outside with
`widened`: whatever reads the float32 gradient gets it, and a reduction that finds the note
sends the half-precision tensor instead (TensorFlow prunes the cast when nothing reads it).
"""

from towers.ops._tensorflow import tf

HALF = (tf.bfloat16, tf.float16)

# The graph's attribute: the name of a tensor `widened` built -> the tensor it widened. On
# the graph itself, so that the note goes with the graph (as `towers.ops._packed_sum`'s).
_NOTES = "_towers_widened"


def narrow_form(tensor: object) -> tf.Tensor | None:
    """The half-precision tensor a float32 `tensor` is exactly the widening of, else None.

    Args:
      tensor: Anything; only a graph's float32 tensor may have a narrow form.

    Returns:
      The bfloat16 or float16 tensor whose cast `tensor` is (in its graph, or noted by
      `widened`), or None.
    """
    if not isinstance(tensor, tf.Tensor) or tf.executing_eagerly():
        return None
    if tensor.dtype != tf.float32:
        return None
    noted = getattr(tensor.graph, _NOTES, {}).get(tensor.name)
    if noted is not None:
        return noted
    if tensor.op.type == "Cast" and tensor.op.inputs[0].dtype in HALF:
        return tensor.op.inputs[0]
    return None


def widened(narrow: tf.Tensor) -> tf.Tensor:
    """`narrow` cast to float32, noted so that `narrow_form` finds `narrow` again.

    Args:
      narrow: A bfloat16 or float16 tensor (in a graph; eagerly, only the cast).

    Returns:
      The float32 tensor.
    """
    wide = tf.cast(narrow, tf.float32)
    if not tf.executing_eagerly():
        notes = getattr(wide.graph, _NOTES, None)
        if notes is None:
            notes = {}
            setattr(wide.graph, _NOTES, notes)
        notes[wide.name] = narrow
    return wide


def narrow_columns(columns: list[list[tf.Tensor]]) -> list[list[tf.Tensor] | None]:
    """For each column of K tensors, their narrow forms when all K have one of one dtype."""
    out = []
    for column in columns:
        forms = [narrow_form(t) for t in column]
        same = all(f is not None for f in forms) and len({f.dtype for f in forms}) == 1
        out.append(forms if same else None)
    return out
