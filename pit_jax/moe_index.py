"""`MoeIndex`: the routing index of a mixture-of-experts layer (which tokens each expert takes).

T tokens each choose k experts out of E (`expert_ids [..., T, k]`). Assignment
`a = t * k + j` is token t's j-th choice; there are A = T * k of them. The index lists,
for every expert e, the assignments routed to it, in ANY order (the GPU takes slots with
atomics in one pass: no sort, no host sync), and in an extra group E the dropped
assignments (an expert id outside [0, E): inside jit that cannot raise, so the
assignment is dropped, counted in `dropped()`, and contributes zero):

- `lists[..., e, slot]`: assignment ids of group e for `slot < counts[..., e]`, -1 after.
- `counts[..., e]`: how many assignments group e holds (e = E: the dropped ones).

Every group has room for all A assignments, so a valid routing never drops a token
(dropless), however skewed. Every assignment is in exactly one group.

Arrays are leaves (batched, traced, vmapped like any pytree); E and k are static.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple

import jax
import jax.numpy as jnp


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class MoeIndex:
    """Per-expert lists of routed assignments. Build it with `pit_jax.moe_index`."""

    lists: jax.Array  # int32 [..., E + 1, T * k]
    counts: jax.Array  # int32 [..., E + 1]
    num_experts: int
    top_k: int

    def tree_flatten(self):
        return (self.lists, self.counts), (self.num_experts, self.top_k)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children, *aux)

    @property
    def num_assignments(self) -> int:
        return self.lists.shape[-1]

    @property
    def num_tokens(self) -> int:
        return self.num_assignments // self.top_k

    @property
    def batch_shape(self) -> Tuple[int, ...]:
        return tuple(self.counts.shape[:-1])

    def __repr__(self) -> str:
        return (
            f"MoeIndex(num_experts={self.num_experts}, top_k={self.top_k}, num_tokens={self.num_tokens}, "
            f"batch_shape={self.batch_shape})"
        )

    # -- derived views (pure JAX) ---------------------------------------------------
    def expert_counts(self) -> jax.Array:
        """int32 [..., E]: tokens routed to each expert (the load of each expert)."""
        return self.counts[..., : self.num_experts]

    def dropped(self) -> jax.Array:
        """int32 [...]: assignments whose expert id was out of range (they contribute zero)."""
        return self.counts[..., self.num_experts]

    def assignment_groups(self) -> jax.Array:
        """int32 [..., T * k]: the group (expert, or E for dropped) of every assignment."""
        groups = self.num_experts + 1
        a = self.num_assignments
        slot = jnp.arange(a)
        lists = self.lists.reshape(-1, groups, a)
        counts = self.counts.reshape(-1, groups)

        def one(lists, counts):
            valid = slot[None, :] < counts[:, None]
            ids = jnp.where(valid, lists, a)  # a: out of bounds, dropped by the scatter
            group = jnp.broadcast_to(jnp.arange(groups, dtype=jnp.int32)[:, None], ids.shape)
            return jnp.full((a,), self.num_experts, jnp.int32).at[ids.ravel()].set(group.ravel(), mode="drop")

        out = jax.vmap(one)(lists, counts) if lists.shape[0] else jnp.zeros((0, a), jnp.int32)
        return out.reshape(*self.batch_shape, a)
