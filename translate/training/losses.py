"""Label-smoothed cross-entropy and token accuracy, returned as (sum, count) over real tokens."""

from __future__ import annotations

import functools

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


def projected_cross_entropy(
    y: jax.Array,
    embedding: jax.Array,
    targets: jax.Array,
    weights: jax.Array,
    label_smoothing: float,
    keep: str = "exp",
    bias: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """The pre-softmax projection (Sec. 3.4) and the loss above in one step, for training.

    Computes what `smoothed_cross_entropy(y @ embedding.T + bias, ...)` and `correct_tokens`
    compute,
    with a hand-written gradient. Differentiating the two separately costs several passes over
    the [N, V] logits, the largest tensor of the step, and a transposed copy of their gradient
    for the embedding's gradient; here the backward pass makes one elementwise pass and feeds
    both products in the layout they want.

    Args:
      y: [..., D] decoder output in the compute dtype.
      embedding: [V, D] shared embedding (float32 parameters; cast to y's dtype).
      targets: [...] token ids; weights: [...] 1.0 on real tokens, 0.0 on padding.
      label_smoothing: eps.
      bias: [V] float32, the projection's bias (`model.logits_bias`), or None: no bias.
      keep: what the forward pass keeps for the backward pass, both [N, V] float32 (see
        `loss_keep`). "exp": exp(logits - max), computed once and summed apart, which is
        fastest on CPUs. "logits": the logits themselves, the softmax recomputed inside the
        backward pass's one elementwise pass, so the forward pass fuses exp into its sum and
        the exps are never written to memory: fewer passes for memory-bound GPUs.
        "logits_bf16": the same with the logits rounded to bfloat16 as the product writes
        them, as mixed-precision toolkits' logits are, and read back as float32 for the
        softmax: half the bytes of every pass over them, at bfloat16's rounding of the loss
        and its gradient. Never chosen by "auto"; a knob for GPUs, to be measured there.

    Returns:
      (smoothed loss sum, NLL sum, token count, correct arg-max count), float32 scalars. The two
      sums are differentiable; the counts are constants.
    """
    d = y.shape[-1]
    y2, t, w = y.reshape(-1, d), targets.reshape(-1), weights.reshape(-1).astype(jnp.float32)
    loss_fn = {
        "exp": _loss_keeping_exp,
        "logits": _loss_keeping_logits,
        "logits_bf16": _loss_keeping_bf16_logits,
    }[keep]
    loss, nll, correct = loss_fn(y2, embedding, t, w, label_smoothing, bias)
    return loss, nll, jnp.sum(w), correct


def loss_keep(platform: str) -> str:
    """The `keep` of `projected_cross_entropy` for devices of this platform ("cpu", "gpu")."""
    return "exp" if platform == "cpu" else "logits"


def _logits(y, embedding, bias):
    logits = jnp.einsum(
        "nd,vd->nv", y, embedding.astype(y.dtype), preferred_element_type=jnp.float32
    )  # [N, V]
    return logits if bias is None else logits + bias


def _loss_sums(logits, top, lse, targets, weights, label_smoothing):
    """(loss sum, NLL sum, correct count) from the logits, their max and log-sum-exp."""
    target_logit = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]  # [N]
    nll = lse - target_logit
    uniform = lse - jnp.mean(logits, axis=-1)  # cross-entropy against 1/V
    loss = (1.0 - label_smoothing) * nll + label_smoothing * uniform
    # The target is the arg-max when its logit is the largest (exact ties count as correct).
    correct = jnp.sum((target_logit >= top) * weights)
    return jnp.sum(loss * weights), jnp.sum(nll * weights), correct


def transposed_copy(x: jax.Array) -> jax.Array:
    """x.T [B, A] for x [A, B], written out row-major by a gather.

    XLA's CPU backend runs a bfloat16 product at the bfloat16 rate only on operands laid out
    row-major with the contraction on the left operand's last axis and the right operand's
    first; otherwise it converts both operands to float32 and runs the product at about a
    quarter of that rate. It also turns a plain transpose into a change of layout that it
    pushes into the product, so `x.T` feeding a product gives no row-major copy; a gather
    with iota indices is not rewritten that way.
    """
    rows, cols = x.shape
    return x[jnp.arange(rows)[None, :], jnp.arange(cols)[:, None]]  # [B, A]


def _loss_grads(
    y,
    embedding,
    targets,
    weights,
    bias,
    probs,
    total,
    label_smoothing,
    cotangents,
    row_major=False,
):
    """Gradients for y, the embedding and the bias (None without one), the softmax being
    `probs / total` ([N, V], [N]).

    `row_major` (the CPU's path, `keep="exp"`) with bfloat16 operands (`model.matmul_dtype`)
    arranges both products for the CPU's bfloat16 path (docs/speed.md): d_y accumulates in
    float32 and is rounded after (a product with a bfloat16 result ran in float32, 38 ms
    against 10 ms for Multi30k's [2016, 8000] on the development CPU), and the embedding's
    gradient is (y^T d_logits)^T with both transposes copied (`transposed_copy`), since
    d_logits^T y contracts the first axis of both [N, V] and [N, D] operands (float32 again,
    46 ms against 12 ms). The same products, their sums added in another order. Otherwise
    (float32, or the GPU's path) the products are written plainly.
    """
    g_loss, g_nll, _ = cotangents
    vocab = probs.shape[-1]
    # d(sum_n w_n * CE_n(q)) / d logits = w_n * (softmax - q) for a target distribution q;
    # the loss uses q = (1 - eps) one_hot + eps / V and the NLL q = one_hot.
    scale = weights * (g_loss + g_nll)
    scale = (scale if total is None else scale / total)[:, None]
    hot = (weights * (g_loss * (1.0 - label_smoothing) + g_nll))[:, None]
    flat = (weights * g_loss * label_smoothing / vocab)[:, None]
    is_target = jnp.arange(vocab)[None, :] == targets[:, None]  # [N, V]
    d_logits = scale * probs - jnp.where(is_target, hot, 0.0) - flat
    d_bias = None if bias is None else jnp.sum(d_logits, axis=0).astype(bias.dtype)  # [V]
    d_logits = d_logits.astype(y.dtype)  # [N, V]
    product_embedding = embedding.astype(y.dtype)
    f32 = jnp.float32
    if row_major and y.dtype == jnp.bfloat16:  # float32 products run at one rate either way
        d_y = jnp.einsum("nv,vd->nd", d_logits, product_embedding, preferred_element_type=f32)
        d_y = d_y.astype(y.dtype)  # [N, D]
        d_embedding_t = jnp.einsum(
            "dn,nv->dv", transposed_copy(y), d_logits, preferred_element_type=f32
        )
        d_embedding = transposed_copy(d_embedding_t)  # [V, D]
    else:
        d_y = jnp.einsum("nv,vd->nd", d_logits, product_embedding)  # [N, D]
        d_embedding = jnp.einsum("nv,nd->vd", d_logits, y, preferred_element_type=f32)
    return d_y, d_embedding.astype(embedding.dtype), None, jnp.zeros_like(weights), d_bias


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _loss_keeping_exp(y, embedding, targets, weights, label_smoothing, bias):
    return _keep_exp_fwd(y, embedding, targets, weights, label_smoothing, bias)[0]


def _keep_exp_fwd(y, embedding, targets, weights, label_smoothing, bias):
    logits = _logits(y, embedding, bias)
    top = jnp.max(logits, axis=-1)  # [N]
    # exp is computed once, kept for the backward pass (which needs the softmax) and summed
    # apart: fused into the reduction it ran single-threaded, 6x slower on CPUs.
    exps = jax.lax.optimization_barrier(jnp.exp(logits - top[:, None]))  # [N, V]
    total = jnp.sum(exps, axis=-1)  # [N]
    lse = top + jnp.log(total)
    out = _loss_sums(logits, top, lse, targets, weights, label_smoothing)
    return out, (y, embedding, targets, weights, bias, exps, total)


def _keep_exp_bwd(label_smoothing, residuals, cotangents):
    return _loss_grads(*residuals, label_smoothing, cotangents, row_major=True)


_loss_keeping_exp.defvjp(_keep_exp_fwd, _keep_exp_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _loss_keeping_logits(y, embedding, targets, weights, label_smoothing, bias):
    return _keep_logits_fwd(y, embedding, targets, weights, label_smoothing, bias)[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _loss_keeping_bf16_logits(y, embedding, targets, weights, label_smoothing, bias):
    return _keep_bf16_logits_fwd(y, embedding, targets, weights, label_smoothing, bias)[0]


def _keep_logits_fwd(y, embedding, targets, weights, label_smoothing, bias, dtype=jnp.float32):
    # `dtype` is how the logits are written and kept: float32 ("logits"), or rounded once to
    # bfloat16 as the product writes them ("logits_bf16"), each read back as float32.
    logits = _logits(y, embedding, bias).astype(dtype)  # [N, V]
    wide = logits.astype(jnp.float32)
    top = jnp.max(wide, axis=-1)  # [N]
    lse = top + jnp.log(jnp.sum(jnp.exp(wide - top[:, None]), axis=-1))  # [N]
    out = _loss_sums(wide, top, lse, targets, weights, label_smoothing)
    return out, (y, embedding, targets, weights, bias, logits, lse)


def _keep_bf16_logits_fwd(y, embedding, targets, weights, label_smoothing, bias):
    return _keep_logits_fwd(y, embedding, targets, weights, label_smoothing, bias, jnp.bfloat16)


def _keep_logits_bwd(label_smoothing, residuals, cotangents):
    y, embedding, targets, weights, bias, logits, lse = residuals
    # The softmax, fused into d_logits' pass; the bfloat16 logits' gradient is taken as if
    # they had not been rounded (the rounding's own derivative is 1 almost everywhere).
    probs = jnp.exp(logits.astype(jnp.float32) - lse[:, None])  # [N, V]
    return _loss_grads(
        y, embedding, targets, weights, bias, probs, None, label_smoothing, cotangents
    )


_loss_keeping_logits.defvjp(_keep_logits_fwd, _keep_logits_bwd)
_loss_keeping_bf16_logits.defvjp(_keep_bf16_logits_fwd, _keep_logits_bwd)
