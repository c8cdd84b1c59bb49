"""Label-smoothed cross-entropy and token accuracy, returned as (sum, count) over real tokens."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def smoothed_cross_entropy(
    logits: jax.Array, targets: jax.Array, weights: jax.Array, label_smoothing: float
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Cross-entropy against (1 - eps) * one_hot + eps / V (Sec. 5.4, after Szegedy et al.).

    Args:
      logits: [B, T, V] float32.
      targets: [B, T] int token ids.
      weights: [B, T] 1.0 on real target tokens, 0.0 on padding.
      label_smoothing: eps.

    Returns:
      (smoothed loss sum, unsmoothed NLL sum, token count), each a float32 scalar. Dividing a
      sum by the count gives the per-token mean, whatever the split over devices or micro-batches.
    """
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [B, T, V]
    nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # [B, T]
    uniform = -jnp.mean(log_probs, axis=-1)  # [B, T]: cross-entropy against 1/V
    loss = (1.0 - label_smoothing) * nll + label_smoothing * uniform
    return jnp.sum(loss * weights), jnp.sum(nll * weights), jnp.sum(weights)


def correct_tokens(logits: jax.Array, targets: jax.Array, weights: jax.Array) -> jax.Array:
    """Number of real target tokens whose arg-max prediction is right."""
    return jnp.sum((jnp.argmax(logits, axis=-1) == targets) * weights)
