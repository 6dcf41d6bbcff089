"""`MoE` for flax.nnx: the dropless mixture-of-experts layer of `pit_jax.flax.linen_moe`."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes

from pit_jax.flax import _moe_router
from pit_jax.flax.linen_moe import default_expert_init, default_router_init


class MoE(nnx.Module):
    """A dropless mixture-of-experts FFN, the nnx twin of `pit_jax.flax.MoE` (linen): the
    same parameters (`router_kernel` [D, E], `w_in` [E, D, F], `w_gate` [E, D, F] when
    gated, `w_out` [E, F, D]), initializers and attributes, the same output for the same
    parameters. See the linen layer for the math and the attributes.

    Auxiliary outputs: every call overwrites these `nnx.Intermediate` attributes (fixed
    shapes, so they are ordinary state under `nnx.jit` / `nnx.grad`):
      `aux_loss` (float32 []: load_balancing_weight * load balancing + z_loss_weight *
      z-loss; add `layer.aux_loss[...]` to the training loss inside the differentiated
      function), `load_balancing_loss`, `router_z_loss` (unweighted), `expert_counts`
      (int32 [E]) and `dropped` (int32 []). A layer called several times in one step keeps
      the last call's values.

    Router noise (router_jitter / router_noise_std > 0) applies when not deterministic
    (`deterministic` attribute, `model.train()` / `model.eval()`, or the call argument) and
    draws from `rngs[rng_collection]` given here or to the call.
    """

    def __init__(
        self,
        in_features: int,
        num_experts: int,
        hidden_dim: int,
        *,
        top_k: int = 1,
        activation: Union[str, Callable[[jax.Array], jax.Array]] = "relu",
        gated: bool = False,
        dtype: Optional[Any] = None,
        param_dtype: Any = jnp.float32,
        precision: Any = None,
        kernel_init: Any = default_expert_init,
        router_init: Any = default_router_init,
        renormalize: Optional[bool] = None,
        router_jitter: float = 0.0,
        router_noise_std: float = 0.0,
        load_balancing_weight: float = 1e-2,
        z_loss_weight: float = 1e-3,
        deterministic: bool = False,
        rng_collection: str = "dropout",
        batch_dims: int = 0,
        rngs: nnx.Rngs,
    ):
        what = "pit_jax.flax.nnx.MoE"
        _moe_router.check_config(num_experts, top_k, hidden_dim, what)
        if not isinstance(in_features, int) or in_features < 1:
            raise ValueError(f"{what}: in_features must be an int >= 1, got {in_features!r}")
        e, d, f = num_experts, in_features, hidden_dim
        self.in_features, self.num_experts, self.hidden_dim, self.top_k = d, e, f, top_k
        self.activation, self.gated = activation, gated
        self.dtype, self.param_dtype, self.precision = dtype, param_dtype, precision
        self.renormalize = renormalize
        self.router_jitter, self.router_noise_std = router_jitter, router_noise_std
        self.load_balancing_weight, self.z_loss_weight = load_balancing_weight, z_loss_weight
        self.deterministic, self.rng_collection = deterministic, rng_collection
        self.batch_dims = batch_dims
        self.router_kernel = nnx.Param(router_init(rngs.params(), (d, e), param_dtype))
        self.w_in = nnx.Param(kernel_init(rngs.params(), (e, d, f), param_dtype))
        self.w_gate = nnx.Param(kernel_init(rngs.params(), (e, d, f), param_dtype)) if gated else None
        self.w_out = nnx.Param(kernel_init(rngs.params(), (e, f, d), param_dtype))
        self.rngs = nnx.data(None)
        if router_jitter > 0 or router_noise_std > 0:
            try:  # the stream (or rngs' default); else the call must bring its rngs
                self.rngs = rngs[rng_collection].fork()
            except (KeyError, AttributeError):
                pass
        self.aux_loss = nnx.Intermediate(jnp.zeros((), jnp.float32))
        self.load_balancing_loss = nnx.Intermediate(jnp.zeros((), jnp.float32))
        self.router_z_loss = nnx.Intermediate(jnp.zeros((), jnp.float32))
        self.expert_counts = nnx.Intermediate(jnp.zeros((e,), jnp.int32))
        self.dropped = nnx.Intermediate(jnp.zeros((), jnp.int32))

    def set_view(self, deterministic: Optional[bool] = None):
        """For `nnx.view(model, deterministic=...)`."""
        if deterministic is not None:
            self.deterministic = deterministic

    def __call__(self, x, *, deterministic: Optional[bool] = None, rngs: Any = None):
        what = "pit_jax.flax.nnx.MoE"
        x = jnp.asarray(x)
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"{what}: x must be [..., D] with D = in_features = {self.in_features}, got {x.shape}")
        deterministic = self.deterministic if deterministic is None else deterministic
        rng = None
        if not deterministic and (self.router_jitter > 0 or self.router_noise_std > 0):
            rng = self._noise_key(rngs if rngs is not None else self.rngs, what)
        w_gate = self.w_gate[...] if self.w_gate is not None else None
        xc, w_in, w_out, w_gate = dtypes.promote_dtype(
            (x, self.w_in[...], self.w_out[...], w_gate), dtype=self.dtype
        )
        y, stats = _moe_router.moe_forward(
            xc, x, self.router_kernel[...], w_in, w_out, w_gate,
            top_k=self.top_k, activation=self.activation, renormalize=self.renormalize,
            jitter=self.router_jitter, noise_std=self.router_noise_std, rng=rng, precision=self.precision,
            batch_dims=self.batch_dims,
        )
        self.aux_loss.set_value(stats.aux_loss(self.load_balancing_weight, self.z_loss_weight))
        self.load_balancing_loss.set_value(stats.load_balancing_loss)
        self.router_z_loss.set_value(stats.router_z_loss)
        self.expert_counts.set_value(stats.expert_counts)
        self.dropped.set_value(stats.dropped)
        return y

    def _noise_key(self, rngs, what):
        if rngs is None:
            raise ValueError(
                f"{what}: router noise is on and deterministic=False, but no rngs: pass "
                f"rngs=nnx.Rngs({self.rng_collection}=...) to the constructor or the call, or deterministic=True"
            )
        if isinstance(rngs, nnx.Rngs):
            return rngs[self.rng_collection]()
        if isinstance(rngs, nnx.RngStream):
            return rngs()
        return rngs  # a key
