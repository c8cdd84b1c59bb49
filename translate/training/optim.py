"""The paper's learning-rate schedule and Adam (Sec. 5.3), two decays for short runs, AdamW, and
Muon for the linear layers' kernels."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from translate.config import Config, LrDecay, Optimizer, check_choice

# Muon (Jordan et al. 2024): the quintic Newton-Schulz iteration's coefficients from that work,
# which take every singular value of a matrix scaled to Frobenius norm 1 into about [0.7, 1.2]
# in 5 steps; the momentum of its Nesterov form; and the update's RMS, matched to AdamW's
# (Liu et al. 2025, "Muon is Scalable for LLM Training") so that AdamW's learning rate and
# weight decay carry over unchanged.
NEWTON_SCHULZ = (3.4445, -4.7750, 2.0315)
NEWTON_SCHULZ_STEPS = 5
MUON_MOMENTUM = 0.95
MUON_RMS = 0.2


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
    if shape not in ("linear", "cosine"):
        raise ValueError(f"train.lr_decay={shape!r}: a decay to 0 is 'linear' or 'cosine'")
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
    if check_choice(t.lr_decay, LrDecay, "train.lr_decay") == "rsqrt":
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


def orthogonalize(g: jax.Array) -> jax.Array:
    """About the semi-orthogonal factor U V^T of each g = U S V^T ([..., m, n] -> [..., m, n]):
    Newton-Schulz iterations x <- a x + (b x x^T + c (x x^T)^2) x from g / ||g||_F, on the wide
    orientation so that x x^T is the smaller Gram matrix. In float32: bfloat16 operands (as
    Jordan et al. run them) made the Multi30k recipe's step no faster on a CPU."""
    tall = g.shape[-2] > g.shape[-1]
    x = jnp.swapaxes(g, -1, -2) if tall else g
    x = x / (jnp.linalg.norm(x, axis=(-2, -1), keepdims=True) + 1e-7)  # [..., min, max]

    a, b, c = NEWTON_SCHULZ
    for _ in range(NEWTON_SCHULZ_STEPS):
        gram = x @ jnp.swapaxes(x, -1, -2)  # [..., min, min]
        x = a * x + (b * gram + c * gram @ gram) @ x
    return jnp.swapaxes(x, -1, -2) if tall else x


# Written here rather than taken from optax.contrib.muon, whose bias-corrected Nesterov form moves
# the weights differently (about 1e-3 apart at step 50, 3e-6 at step 200) from the form tuned here.
def scale_by_muon(momentum: float = MUON_MOMENTUM) -> optax.GradientTransformation:
    """Muon's direction for matrices: Nesterov momentum m <- momentum m + g, then the update
    orthogonalize(g + momentum m), scaled by MUON_RMS sqrt(max(fan_in, fan_out)) so that its RMS
    is about MUON_RMS whatever the shape (an orthogonal [m, n] matrix has RMS max(m, n)^-0.5).
    Matrices of one shape are orthogonalised together, stacked: a few large products instead of
    many small ones."""

    def init(params):
        return jax.tree.map(jnp.zeros_like, params)

    def update(updates, state, params=None):
        del params
        state = jax.tree.map(lambda m, g: momentum * m + g, state, updates)
        nesterov, treedef = jax.tree.flatten(
            jax.tree.map(lambda m, g: g + momentum * m, state, updates)
        )
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, u in enumerate(nesterov):
            by_shape.setdefault(u.shape, []).append(i)
        out = list(nesterov)
        for shape, indices in by_shape.items():
            stacked = orthogonalize(jnp.stack([nesterov[i] for i in indices]))  # [k, m, n]
            for j, i in enumerate(indices):
                out[i] = stacked[j] * (MUON_RMS * max(shape) ** 0.5)
        return jax.tree.unflatten(treedef, out), state

    return optax.GradientTransformation(init, update)


def muon_params(params):
    """Which parameters Muon moves: every linear layer's kernel (two dimensions), not the
    embedding (shared with the softmax, a lookup table whose rows move apart) nor a relative
    position bias's table (models/positions.py: a lookup table too)."""

    def label(path, p):
        tables = ("embedding", "table")
        return p.ndim == 2 and not any(getattr(k, "key", None) in tables for k in path)

    return jax.tree_util.tree_map_with_path(label, params)


def make_optimizer(config: Config) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Adam with beta1 = 0.9, beta2 = 0.98, eps = 1e-9 (config) on the configured schedule;
    with `train.weight_decay`, AdamW: the decay scaled by the learning rate, as PyTorch's. With
    `train.optimizer` "muon", Muon for the linear layers' kernels (`muon_params`) on the same
    schedule and decay, and that Adam for the rest."""
    t = config.train
    schedule = make_schedule(config)
    adam = dict(b1=t.adam_beta1, b2=t.adam_beta2, eps=t.adam_eps)
    if t.weight_decay:
        optimizer = optax.adamw(schedule, **adam, weight_decay=t.weight_decay, mask=decayed)
    else:
        optimizer = optax.adam(schedule, **adam)
    if check_choice(t.optimizer, Optimizer, "train.optimizer") == "muon":
        muon = optax.chain(
            scale_by_muon(),
            optax.add_decayed_weights(t.weight_decay),
            optax.scale_by_learning_rate(schedule),
        )

        def labels(params):
            return jax.tree.map(lambda m: "muon" if m else "adam", muon_params(params))

        optimizer = optax.partition({"muon": muon, "adam": optimizer}, labels)
    return optimizer, schedule
