"""TensorFlow's fused update kernels, or the same arithmetic in plain ops where a device has none.

The rules use `ResourceApplyAdam` and its kin: one op per variable. A GPU has them for float16,
float32 and float64 but not bfloat16 (nor `ResourceSparseApplyAdagradV2` of it); with soft
placement off, a bfloat16 variable on a GPU would fail when the step runs. There each function
builds the kernel's own formula (TensorFlow's `training_ops.cc`, term by term) from plain ops,
which have bfloat16 kernels everywhere.
"""

from typing import Any

import tensorflow as tf

from towers.ops.internal import has_kernel, update_ops


def _fused(op_type: str, var: tf.Variable) -> bool:
    return has_kernel(op_type, var.device, T=var.dtype)


def _after(*updates: Any) -> Any:
    """A control dependency on updates (eagerly, none)."""
    return tf.control_dependencies(update_ops(updates))


def gradient_descent(var: tf.Variable, lr: tf.Tensor, grad: tf.Tensor) -> Any:
    """`var -= lr * grad`."""
    if _fused("ResourceApplyGradientDescent", var):
        return tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=lr, delta=grad)
    return var.assign_sub(grad * lr)


def momentum(
    var: tf.Variable,
    accum: tf.Variable,
    lr: tf.Tensor,
    grad: tf.Tensor,
    mu: tf.Tensor,
    nesterov: bool,
) -> Any:
    """`accum = mu accum + grad; var -= lr accum` (Nesterov: `var -= lr grad + lr mu accum`)."""
    if _fused("ResourceApplyMomentum", var):
        return tf.raw_ops.ResourceApplyMomentum(
            var=var.handle, accum=accum.handle, lr=lr, grad=grad, momentum=mu, use_nesterov=nesterov
        )
    new_accum = accum.assign(accum * mu + grad)
    with _after(new_accum):
        value = accum.read_value()
        step = grad * lr + value * mu * lr if nesterov else value * lr
        return var.assign_sub(step)


def adam(
    var: tf.Variable,
    m: tf.Variable,
    v: tf.Variable,
    lr: tf.Tensor,
    beta1: tf.Tensor,
    beta2: tf.Tensor,
    epsilon: tf.Tensor,
    step: tf.Tensor,
    grad: tf.Tensor,
) -> Any:
    """Adam with bias correction folded into the rate, as `ResourceApplyAdam` computes it."""
    beta1_power, beta2_power = tf.pow(beta1, step), tf.pow(beta2, step)
    if _fused("ResourceApplyAdam", var):
        return tf.raw_ops.ResourceApplyAdam(
            var=var.handle,
            m=m.handle,
            v=v.handle,
            beta1_power=beta1_power,
            beta2_power=beta2_power,
            lr=lr,
            beta1=beta1,
            beta2=beta2,
            epsilon=epsilon,
            grad=grad,
        )
    one = tf.ones([], var.dtype)
    alpha = lr * tf.sqrt(one - beta2_power) / (one - beta1_power)
    new_m = m.assign_add((grad - m) * (one - beta1))
    new_v = v.assign_add((tf.square(grad) - v) * (one - beta2))
    with _after(new_m, new_v):
        return var.assign_sub((m.read_value() * alpha) / (tf.sqrt(v.read_value()) + epsilon))


def rmsprop(
    var: tf.Variable,
    slots: dict[str, tf.Variable],
    lr: tf.Tensor,
    rho: tf.Tensor,
    mu: tf.Tensor,
    epsilon: tf.Tensor,
    grad: tf.Tensor,
) -> Any:
    """RMSProp with momentum, centered when `slots` has "mg": `ResourceApply[Centered]RMSProp`."""
    ms, mom, mg = slots["ms"], slots["mom"], slots.get("mg")
    op_type = "ResourceApplyRMSProp" if mg is None else "ResourceApplyCenteredRMSProp"
    if _fused(op_type, var):
        common = dict(
            var=var.handle,
            ms=ms.handle,
            mom=mom.handle,
            lr=lr,
            rho=rho,
            momentum=mu,
            epsilon=epsilon,
            grad=grad,
        )
        if mg is None:
            return tf.raw_ops.ResourceApplyRMSProp(**common)
        return tf.raw_ops.ResourceApplyCenteredRMSProp(mg=mg.handle, **common)
    one = tf.ones([], var.dtype)
    new_ms = ms.assign_add((tf.square(grad) - ms) * (one - rho))
    new_mg = None if mg is None else mg.assign_add((grad - mg) * (one - rho))
    with _after(new_ms, new_mg):
        denominator = ms.read_value() + epsilon
        if mg is not None:
            denominator = ms.read_value() - tf.square(mg.read_value()) + epsilon
        new_mom = mom.assign(mom * mu + grad * lr / tf.sqrt(denominator))
    with _after(new_mom):
        return var.assign_sub(mom.read_value())


def adagrad(
    var: tf.Variable, accum: tf.Variable, lr: tf.Tensor, epsilon: tf.Tensor, grad: tf.Tensor
) -> Any:
    """`accum += grad^2; var -= lr grad / (sqrt(accum) + epsilon)` (`ResourceApplyAdagradV2`)."""
    if _fused("ResourceApplyAdagradV2", var):
        return tf.raw_ops.ResourceApplyAdagradV2(
            var=var.handle, accum=accum.handle, lr=lr, epsilon=epsilon, grad=grad
        )
    new_accum = accum.assign_add(tf.square(grad))
    with _after(new_accum):
        return var.assign_sub(grad * lr / (tf.sqrt(accum.read_value()) + epsilon))


def sparse_adagrad(
    var: tf.Variable,
    accum: tf.Variable,
    lr: tf.Tensor,
    epsilon: tf.Tensor,
    grad: tf.IndexedSlices,
) -> Any:
    """Adagrad on the rows of `grad` only (unique indices): `ResourceSparseApplyAdagradV2`."""
    if _fused("ResourceSparseApplyAdagradV2", var):
        return tf.raw_ops.ResourceSparseApplyAdagradV2(
            var=var.handle,
            accum=accum.handle,
            lr=lr,
            epsilon=epsilon,
            grad=grad.values,
            indices=grad.indices,
        )
    new_accum = accum.scatter_add(tf.IndexedSlices(tf.square(grad.values), grad.indices))
    with _after(new_accum):
        rows = accum.sparse_read(grad.indices)
        step = grad.values * lr / (tf.sqrt(rows) + epsilon)
        return var.scatter_sub(tf.IndexedSlices(step, grad.indices))
