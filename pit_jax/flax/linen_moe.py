"""`MoE` for flax.linen: a dropless mixture-of-experts feed-forward layer on pit_jax's ops."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax.linen.dtypes import promote_dtype

from pit_jax.flax import _moe_router

# Expert weights are [E, fan_in, fan_out]: the expert axis is a batch axis of the init.
default_expert_init = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
# A small router init (Switch Transformer): near-uniform routing at the start.
default_router_init = nn.initializers.variance_scaling(0.1, "fan_in", "truncated_normal")


class MoE(nn.Module):
    """A dropless mixture-of-experts FFN: y = sum_j gate_j * FFN_{e_j}(x) over each token's
    top-k experts, computed by `pit_jax.moe_index` + `pit_jax.moe_ffn` (every token is
    processed by its experts, however uneven the routing: no capacity, no dropping).

    Parameters: "router_kernel" [D, E] (float32 routing, see `_moe_router`), "w_in"
    [E, D, F], "w_gate" [E, D, F] (gated only), "w_out" [E, F, D]. The expert FFN is
    act(x @ w_in) @ w_out, or with gated=True (SwiGLU for activation="silu")
    (act(x @ w_gate) * (x @ w_in)) @ w_out.

    Call: `y = layer(x, deterministic=True)` for x [..., D] (e.g. [B, S, D]); all leading
    dims are one token group (routing is per token). Router noise applies only with
    deterministic=False and needs the `rng_collection` rng.

    Outputs besides y (Flax's `sow`; ask for them with `mutable=[...]` in `apply`):
    - collection "losses", entry "aux_loss": the weighted auxiliary loss
      `load_balancing_weight * load balancing + z_loss_weight * router z-loss` of each call
      (a tuple, one scalar per call). Add `sum(jax.tree_util.tree_leaves(state["losses"]))`
      to the training loss: it covers every MoE layer of a model.
    - collection "intermediates": "load_balancing_loss", "router_z_loss" (unweighted),
      "expert_counts" (int32 [E], assignments per expert), "dropped" (int32, always 0 for
      this router: ids out of range cannot occur).

    Attributes:
      num_experts: E. top_k: experts per token (1: Switch; 2: GShard/Mixtral).
      hidden_dim: F, each expert's hidden width. activation: "relu", "gelu", "silu", ... or
        a callable. gated: add w_gate (a GLU expert).
      dtype: the computation dtype (default: inferred from input and params);
        param_dtype: the parameters' dtype. precision: float32 only: None exact, DEFAULT /
        "tensorfloat32" allows TF32 (router and experts).
      kernel_init: initializer of the expert weights [E, fan_in, fan_out]; router_init: of
        the router kernel [D, E].
      renormalize: rescale each token's k gates to sum to 1 (None: only for top_k > 1).
      router_jitter: eps of the multiplicative uniform noise on the router input (Switch:
        1e-2); router_noise_std: std of Gaussian noise on the logits. Both 0: no noise.
      load_balancing_weight, z_loss_weight: the weights in "aux_loss".
      rng_collection: the rng stream of the router noise.
      batch_dims: leading dims of x kept as token groups, one routing index each (default
        0: all tokens one group, which keeps the experts' tiles full); `jit` over several
        devices splits a group dim (docs/transformations.md). The output is the same.
    """

    num_experts: int
    hidden_dim: int
    top_k: int = 1
    activation: Union[str, Callable[[jax.Array], jax.Array]] = "relu"
    gated: bool = False
    dtype: Optional[Any] = None
    param_dtype: Any = jnp.float32
    precision: Any = None
    kernel_init: Any = default_expert_init
    router_init: Any = default_router_init
    renormalize: Optional[bool] = None
    router_jitter: float = 0.0
    router_noise_std: float = 0.0
    load_balancing_weight: float = 1e-2
    z_loss_weight: float = 1e-3
    rng_collection: str = "dropout"
    batch_dims: int = 0

    @nn.compact
    def __call__(self, x, *, deterministic: bool = True):
        _moe_router.check_config(self.num_experts, self.top_k, self.hidden_dim, "pit_jax.flax.MoE")
        x = jnp.asarray(x)
        if x.ndim < 1:
            raise ValueError("pit_jax.flax.MoE: x must be [..., D], got a scalar")
        e, d, f = self.num_experts, x.shape[-1], self.hidden_dim
        w_router = self.param("router_kernel", self.router_init, (d, e), self.param_dtype)
        w_in = self.param("w_in", self.kernel_init, (e, d, f), self.param_dtype)
        w_gate = self.param("w_gate", self.kernel_init, (e, d, f), self.param_dtype) if self.gated else None
        w_out = self.param("w_out", self.kernel_init, (e, f, d), self.param_dtype)
        noisy = not deterministic and (self.router_jitter > 0 or self.router_noise_std > 0)
        rng = self.make_rng(self.rng_collection) if noisy else None
        xc, w_in, w_out, w_gate = promote_dtype(x, w_in, w_out, w_gate, dtype=self.dtype)
        y, stats = _moe_router.moe_forward(
            xc, x, w_router, w_in, w_out, w_gate,
            top_k=self.top_k, activation=self.activation, renormalize=self.renormalize,
            jitter=self.router_jitter, noise_std=self.router_noise_std, rng=rng, precision=self.precision,
            batch_dims=self.batch_dims,
        )
        if self.is_initializing():  # keep init's variables to "params"
            return y
        self.sow("losses", "aux_loss", stats.aux_loss(self.load_balancing_weight, self.z_loss_weight))
        for name, value in stats._asdict().items():
            self.sow("intermediates", name, value)
        return y
