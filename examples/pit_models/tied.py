"""Layers whose parameter-gradient column sums are tied to the cotangent they sum.

A bias's gradient and a layer norm's scale / offset gradients are column sums over all
rows of a cotangent that the backward also passes on (to the product's transposes, to the
residual). XLA may run such a sum long after that cotangent was made: its memory
scheduler keeps whichever of its candidate orders peaks lowest, and its post-order
candidate runs every parameter's gradient side after the whole backward, where the sums'
inputs have left L2 (the pruned BERT step at 20 %, docs/workloads.md). Here each sum comes
out of the backward together with the cotangent it reads, through one
`lax.optimization_barrier`: whatever reads that cotangent next waits for the sum, so
every schedule runs it while its input is fresh.

The layer norm's backward is written out (float32 statistics, two-pass variance) rather
than differentiated through flax's expression; the values match `nn.LayerNorm` within
the compute dtype's rounding. Parameter trees are those of `nn.Dense` / `nn.LayerNorm`,
so the same parameters run either layer.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from flax import linen as nn


@jax.custom_vjp
def bias_add(y, b):
    """y + b (b [N] broadcast over y's leading dims, y's dtype); its gradient's column sum
    is tied to the cotangent passed on to y."""
    return y + b.astype(y.dtype)


def _bias_add_fwd(y, b):
    return bias_add(y, b), b


def _bias_add_bwd(b, g):
    db = jnp.sum(g, axis=tuple(range(g.ndim - 1)))
    g, db = jax.lax.optimization_barrier((g, db))
    return g, db.astype(b.dtype)


bias_add.defvjp(_bias_add_fwd, _bias_add_bwd)


def _ln_stats(x, epsilon):
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, axis=-1, keepdims=True)
    rstd = jax.lax.rsqrt(jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True) + epsilon)
    return mean, rstd


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def layer_norm(x, scale, offset, epsilon, dtype):
    """((x - mean) * rstd * scale + offset) in `dtype` over x's last dim, statistics in
    float32; the gradients of scale and offset tied to x's."""
    return _ln_fwd(x, scale, offset, epsilon, dtype)[0]


def _ln_fwd(x, scale, offset, epsilon, dtype):
    mean, rstd = _ln_stats(x, epsilon)
    y = ((x.astype(jnp.float32) - mean) * rstd * scale + offset).astype(dtype)
    return y, (x, mean, rstd, scale, offset)


def _ln_bwd(epsilon, dtype, res, g):
    x, mean, rstd, scale, offset = res
    gf = g.astype(jnp.float32)
    xhat = (x.astype(jnp.float32) - mean) * rstd
    rows = tuple(range(g.ndim - 1))
    dscale, doffset = jnp.sum(gf * xhat, axis=rows), jnp.sum(gf, axis=rows)
    gx = gf * scale
    dx = rstd * (gx - jnp.mean(gx, axis=-1, keepdims=True) - xhat * jnp.mean(gx * xhat, axis=-1, keepdims=True))
    dx, dscale, doffset = jax.lax.optimization_barrier((dx.astype(x.dtype), dscale, doffset))
    return dx, dscale.astype(scale.dtype), doffset.astype(offset.dtype)


layer_norm.defvjp(_ln_fwd, _ln_bwd)


class Dense(nn.Module):
    """nn.Dense (kernel [K, N], bias [N]; same initializers and dtype rule) with the bias
    added by `bias_add`. `product(x, kernel)` replaces the dot (a sparse product)."""

    features: int
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, product: Optional[Callable] = None):
        kernel = self.param("kernel", nn.initializers.lecun_normal(), (x.shape[-1], self.features), self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros_init(), (self.features,), self.param_dtype)
        x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
        y = jnp.dot(x, kernel) if product is None else product(x, kernel)
        return bias_add(y, bias)


class LayerNorm(nn.Module):
    """nn.LayerNorm over the last dim (scale, bias; same initializers and dtype rule) by
    `layer_norm`."""

    epsilon: float = 1e-6
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        h = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones_init(), (h,), self.param_dtype)
        offset = self.param("bias", nn.initializers.zeros_init(), (h,), self.param_dtype)
        dtype = self.dtype or jnp.result_type(x, scale, offset)
        return layer_norm(x, scale, offset, float(self.epsilon), jnp.dtype(dtype))
