"""The MoE router and the layer's forward pass, shared by the linen and nnx `MoE` layers.

Router (per token, in float32):
    logits = x @ w_router                      [N, E]
    probs  = softmax(logits)                   [N, E]
    gates, expert_ids = top_k(probs, k)        [N, k] each
    gates /= sum(gates)    (renormalise: default for k > 1)

Auxiliary losses (both scalars, to be added to the training loss with small weights):
- load balancing (Switch Transformer, Fedus et al. 2021): E * sum_e f_e * P_e, where f_e
  is the share of the N*k assignments that went to expert e (counted, so no gradient) and
  P_e the mean router probability of expert e over the N tokens. Pushing it down pushes
  the differentiable P_e towards where f_e is low; it is 1 for a perfectly even routing
  (with uniform probabilities) and E when every token goes to one expert with certainty.
- router z-loss (ST-MoE, Zoph et al. 2022): the mean over tokens of logsumexp(logits)^2;
  it keeps the logits small, which keeps the float32 softmax and the routing stable.

Noise (only with an rng, i.e. training): "jitter" multiplies the router's input by
uniform noise in [1 - eps, 1 + eps] (Switch Transformer); Gaussian noise of a fixed
standard deviation can be added to the logits (noisy top-k, Shazeer et al. 2017).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

import pit_jax
from pit_jax.flax._common import check_batch_dims


class Routing(NamedTuple):
    """What the router decides for N tokens."""

    gates: jax.Array  # float32 [N, k]: combine weights of the chosen experts
    expert_ids: jax.Array  # int32 [N, k]
    probs: jax.Array  # float32 [N, E]: softmax of the logits
    logits: jax.Array  # float32 [N, E]


class MoeStats(NamedTuple):
    """The auxiliary losses (unweighted) and router statistics of one MoE layer call."""

    load_balancing_loss: jax.Array  # float32 []
    router_z_loss: jax.Array  # float32 []
    expert_counts: jax.Array  # int32 [E]: assignments each expert received
    dropped: jax.Array  # int32 []: assignments with no valid expert (0 for this router)

    def aux_loss(self, load_balancing_weight: float, z_loss_weight: float) -> jax.Array:
        return load_balancing_weight * self.load_balancing_loss + z_loss_weight * self.router_z_loss


def _exact(precision):
    # The router is a small product whose rounding decides the routing: float32 unless asked.
    return jax.lax.Precision.HIGHEST if precision is None else precision


def route(
    x: jax.Array,
    w_router: jax.Array,
    *,
    top_k: int,
    renormalize: Optional[bool] = None,
    jitter: float = 0.0,
    noise_std: float = 0.0,
    rng: Optional[jax.Array] = None,
    precision: Any = None,
) -> Routing:
    """Routes tokens x [N, D] to top_k of E experts with w_router [D, E], in float32.

    renormalize: rescale the k gates of a token to sum to 1 (None: only when k > 1; with
      k = 1 that would make every gate 1 and cut the router off from the task loss).
    jitter / noise_std: multiplicative input noise / additive logit noise, applied only
      when `rng` is given.
    """
    num_experts = w_router.shape[-1]
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"MoE router: top_k must be in [1, num_experts={num_experts}], got {top_k}")
    if renormalize is None:
        renormalize = top_k > 1
    xf = x.astype(jnp.float32)
    if rng is not None and jitter > 0:
        rng, key = jax.random.split(rng)
        xf = xf * jax.random.uniform(key, xf.shape, jnp.float32, 1.0 - jitter, 1.0 + jitter)
    logits = jnp.matmul(xf, w_router.astype(jnp.float32), precision=_exact(precision))
    if rng is not None and noise_std > 0:
        logits = logits + noise_std * jax.random.normal(rng, logits.shape, jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    gates, expert_ids = jax.lax.top_k(probs, top_k)
    if renormalize:
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    return Routing(gates, expert_ids.astype(jnp.int32), probs, logits)


def load_balancing_loss(probs: jax.Array, expert_counts: jax.Array, top_k: int) -> jax.Array:
    """E * sum_e f_e * P_e over N tokens: f_e = expert_counts[e] / (N * k) (the share of
    assignments, constant for autodiff), P_e = mean_n probs[n, e]. Zero for no tokens."""
    n, num_experts = probs.shape[-2:]
    if n == 0:
        return jnp.zeros((), jnp.float32)
    share = jax.lax.stop_gradient(expert_counts.astype(jnp.float32)) / (n * top_k)
    mean_prob = jnp.mean(probs, axis=-2)
    return num_experts * jnp.sum(share * mean_prob, axis=-1)


def router_z_loss(logits: jax.Array) -> jax.Array:
    """mean_n logsumexp(logits[n])^2. Zero for no tokens."""
    if logits.shape[-2] == 0:
        return jnp.zeros((), jnp.float32)
    return jnp.mean(jnp.square(jax.nn.logsumexp(logits, axis=-1)), axis=-1)


def check_config(num_experts, top_k, hidden_dim, what="MoE"):
    for name, v in (("num_experts", num_experts), ("top_k", top_k), ("hidden_dim", hidden_dim)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{what}: {name} must be an int >= 1, got {v!r}")
    if top_k > num_experts:
        raise ValueError(f"{what}: top_k={top_k} experts per token, but only num_experts={num_experts}")


def moe_forward(
    x: jax.Array,
    router_input: jax.Array,
    w_router: jax.Array,
    w_in: jax.Array,
    w_out: jax.Array,
    w_gate: Optional[jax.Array],
    *,
    top_k: int,
    activation: Any,
    renormalize: Optional[bool],
    jitter: float,
    noise_std: float,
    rng: Optional[jax.Array],
    precision: Any,
    batch_dims: int = 0,
) -> tuple[jax.Array, MoeStats]:
    """The layer: route, build the routing index, run the experts dropless.

    x [..., D] in the compute dtype; router_input: the same tokens as given (the router
    reads them in float32). The leading dims are folded into one token group: routing is
    per token and nothing is dropped, so the output does not depend on the grouping, and
    one big group keeps each expert's gathered tiles full. `batch_dims` > 0 keeps that
    many leading dims as groups (one routing index each), which `jit` over several
    devices splits. The auxiliary losses are over all tokens of the call.
    """
    lead, d = x.shape[:-1], x.shape[-1]
    check_batch_dims(batch_dims, x.shape, "MoE: ", "token groups; the rest are tokens")
    groups = lead[:batch_dims]
    tokens = x.reshape(-1, d)
    if tokens.shape[0] == 0:  # nothing to route (the reference index cannot fold an empty shape)
        zero = jnp.zeros((), jnp.float32)
        counts = jnp.zeros((w_in.shape[0],), jnp.int32)
        y = jnp.zeros((*lead, w_out.shape[-1]), jnp.result_type(x, w_out))
        return y, MoeStats(zero, zero, counts, jnp.zeros((), jnp.int32))
    routing = route(
        router_input.reshape(-1, d), w_router, top_k=top_k, renormalize=renormalize,
        jitter=jitter, noise_std=noise_std, rng=rng, precision=precision,
    )
    grouped = lambda a: a.reshape(*groups, -1, a.shape[-1])  # noqa: E731  [*groups, tokens, .]
    index = pit_jax.moe_index(grouped(routing.expert_ids), w_in.shape[0])
    y = pit_jax.moe_ffn(
        grouped(tokens), grouped(routing.gates), index, w_in, w_out, w_gate=w_gate, activation=activation,
        precision=precision,
    )
    counts, dropped = index.expert_counts(), index.dropped()
    if groups:  # the call's totals
        counts, dropped = counts.reshape(-1, counts.shape[-1]).sum(0), dropped.sum()
    stats = MoeStats(
        load_balancing_loss=load_balancing_loss(routing.probs, counts, top_k),
        router_z_loss=router_z_loss(routing.logits),
        expert_counts=counts,
        dropped=dropped,
    )
    return y.reshape(*lead, w_out.shape[-1]), stats
