"""The paper's learning-rate schedule and Adam (Sec. 5.3), two decays for short runs, and AdamW."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from translate.config import Config

LR_DECAYS = ("rsqrt", "linear", "cosine")


def inverse_sqrt_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) (Sec. 5.3, eq. 3).

    Steps count from 1, so optax's first update (count 0) uses step 1 and the rate is never 0.
    """

    def schedule(count):
        step = jnp.asarray(count, jnp.float32) + 1.0
        return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

    return schedule


def decay_to_zero_schedule(
    d_model: int, warmup_steps: int, num_train_steps: int, scale: float = 1.0, shape="linear"
) -> optax.Schedule:
    """The paper's warm-up to the paper's peak, then a linear or cosine decay towards 0.

    The peak, scale * d_model^-0.5 * warmup_steps^-0.5, is where eq. 3 peaks. After it the rate
    falls by the fraction p = (step - warmup) / (num_train_steps - warmup + 1) of the way: times
    1 - p (linear) or (1 + cos(pi p)) / 2 (cosine), so the last step's rate is small but not 0.
    A run that ends where the rate has fallen gains from it: the rsqrt rate is still at
    warmup^0.5 / steps^0.5 of its peak when a short run stops.
    """
    peak = scale * d_model**-0.5 * warmup_steps**-0.5
    span = num_train_steps - warmup_steps + 1

    def schedule(count):
        step = jnp.asarray(count, jnp.float32) + 1.0
        p = jnp.clip((step - warmup_steps) / span, 0.0, 1.0)
        fall = 1.0 - p if shape == "linear" else 0.5 * (1.0 + jnp.cos(jnp.pi * p))
        return peak * jnp.where(step < warmup_steps, step / warmup_steps, fall)

    return schedule


def make_schedule(config: Config) -> optax.Schedule:
    t = config.train
    if t.lr_decay == "rsqrt":
        return inverse_sqrt_schedule(config.model.d_model, t.warmup_steps, t.learning_rate_scale)
    return decay_to_zero_schedule(
        config.model.d_model,
        t.warmup_steps,
        t.num_train_steps,
        t.learning_rate_scale,
        shape=t.lr_decay,
    )


def decayed(params):
    """Which parameters `train.weight_decay` shrinks: the matrices and the embedding (two or
    more dimensions), not the biases and LayerNorm gains and offsets (one)."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(config: Config) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9 (config) on the configured schedule;
    with `train.weight_decay`, AdamW: the decay scaled by the learning rate, as PyTorch's."""
    t = config.train
    schedule = make_schedule(config)
    adam = dict(b1=t.adam_beta1, b2=t.adam_beta2, eps=t.adam_eps)
    if t.weight_decay:
        optimizer = optax.adamw(schedule, **adam, weight_decay=t.weight_decay, mask=decayed)
    else:
        optimizer = optax.adam(schedule, **adam)
    return optimizer, schedule
