"""The paper's learning-rate schedule and Adam (Sec. 5.3)."""

from __future__ import annotations

import jax.numpy as jnp
import optax

from translate.config import Config


def inverse_sqrt_schedule(d_model: int, warmup_steps: int, scale: float = 1.0) -> optax.Schedule:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) (Sec. 5.3, eq. 3).

    Steps count from 1, so optax's first update (count 0) uses step 1 and the rate is never 0.
    """

    def schedule(count):
        step = jnp.asarray(count, jnp.float32) + 1.0
        return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

    return schedule


def make_optimizer(config: Config) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9 (config) on the schedule above."""
    t = config.train
    schedule = inverse_sqrt_schedule(config.model.d_model, t.warmup_steps, t.learning_rate_scale)
    optimizer = optax.adam(schedule, b1=t.adam_beta1, b2=t.adam_beta2, eps=t.adam_eps)
    return optimizer, schedule
