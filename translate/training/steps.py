"""The trainer's jitted functions: initialise, train one step, evaluate the dev loss.

`make_steps` assembles them once for a config, vocabulary and mesh. The train step accumulates
the gradients of summed losses over micro-batches (`train.grad_accum_steps`), takes the mean
over every real target token of the batch, and never applies a non-finite update.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from translate import sharding
from translate.config import Config
from translate.data.batching import BatchLayout, make_batch, plan_epoch
from translate.data.corpus import TokenizedCorpus
from translate.models.factory import abstract_model, make_model, resolve_model_attention
from translate.training.losses import loss_keep, projected_cross_entropy
from translate.training.optim import make_optimizer


@jax.tree_util.register_pytree_node_class
class Packed:
    """A pytree carried as its leaves and its structure, for the train step's calls.

    Every call of a jitted function flattens its arguments and rebuilds its results. An
    nnx.State flattens through a Python function at every node and rebuilds an nnx.Variable
    per leaf; for the Multi30k GPU model's 473 parameter and Adam arrays that took 7-11 ms of
    host time per step on the development CPU, more than the step's 6 ms of H100 work. A
    Packed flattens and rebuilds in one Python call each (about 1 ms for the same arrays),
    and the jitted function unpacks it while tracing, where it costs nothing per call.
    """

    __slots__ = ("leaves", "treedef")

    def __init__(self, leaves: list, treedef):
        self.leaves, self.treedef = leaves, treedef

    @classmethod
    def of(cls, tree) -> Packed:
        return cls(*jax.tree.flatten(tree))

    def tree(self):
        """The pytree itself (on the host this rebuilds every node: not for every step)."""
        return jax.tree.unflatten(self.treedef, self.leaves)

    def tree_flatten(self):
        return self.leaves, self.treedef

    @classmethod
    def tree_unflatten(cls, treedef, leaves) -> Packed:
        return cls(list(leaves), treedef)


def make_init(config: Config, vocab_size: int, optimizer, mesh):
    """Jitted key -> (params, opt_state), created directly with their (replicated) shardings."""
    attention = resolve_model_attention(config.model)

    def init(key):
        model = make_model(config.model, vocab_size, nnx.Rngs(params=key), attention)
        params = nnx.state(model, nnx.Param)
        return params, optimizer.init(params)

    replicated = sharding.replicated(mesh)
    return jax.jit(init, out_shardings=(replicated, replicated))


def make_train_step(
    graphdef,
    optimizer,
    label_smoothing: float,
    mesh,
    keep: str = "exp",
    packed: bool = False,
    ema_decay: float = 0.0,
    steps_per_call: int = 1,
):
    """The jitted step: accumulate gradients of summed losses over micro-batches, then update.

    `keep` is the loss's (`losses.projected_cross_entropy`). One step (`train_step`) and one
    wrapper of it (`packed_steps`), with the shardings written once:
    - without `packed`: (params, opt_state, batch, step, key) -> (params, opt_state, metrics);
    - `packed`: the same with the parameters and Adam's state as `Packed` (the trainer's): the
      same program, with less host time per call;
    - `ema_decay` (with `packed`): also takes and returns the parameters' moving average,
      updated as `make_ema_update`'s after the step, in the same call: one program a step
      instead of two;
    - `steps_per_call` K > 1 (with `packed`): one call runs K steps in a `lax.scan`, from K
      batches stacked on a new leading axis (`sharding.put_batches`) and the first step's
      number, and returns each step's metrics stacked: (params, opt_state, [ema,] batches,
      first step, key) -> (params, opt_state, [ema,] metrics [K]). One dispatch for K steps,
      for a step whose host time bounds it. XLA compiles the step inside the loop otherwise
      than alone: the K steps agree with the single step's to float32 rounding (1.3e-6 after
      two steps of the tiny config on the CPU), not bit for bit, so a run with it would not
      repeat a run without it exactly.
    """
    if (ema_decay or steps_per_call > 1) and not packed:
        raise ValueError("the moving average and several steps per call take Packed state")
    step = functools.partial(train_step, graphdef, optimizer, label_smoothing, keep)
    states = 2 + (1 if ema_decay else 0)
    if packed:
        step = functools.partial(packed_steps, step, ema_decay, steps_per_call)
    replicated = sharding.replicated(mesh)
    batches = sharding.batch_sharding(mesh, stacked=steps_per_call > 1)
    return jax.jit(
        step,
        in_shardings=(replicated,) * states + (batches, None, replicated),
        out_shardings=(replicated,) * (states + 1),
        donate_argnums=tuple(range(states)),
    )


def summed_loss(graphdef, label_smoothing: float, keep: str, params, micro, key):
    """A micro-batch's summed label-smoothed loss, and (nll, tokens, correct) beside it."""
    model = nnx.merge(graphdef, params)
    y = model.hidden(micro, dropout_key=key)  # [R, T, D]
    weights = (micro.tgt_segments > 0).astype(jnp.float32)
    loss_sum, nll_sum, count, correct = projected_cross_entropy(
        y.astype(model.product_dtype),
        model.embed.embedding[...],
        micro.tgt_out,
        weights,
        label_smoothing,
        keep,
        model.output_bias(),
    )
    return loss_sum, (nll_sum, count, correct)


def train_step(
    graphdef, optimizer, label_smoothing, keep, params, opt_state, batch, step, base_key
):
    """One optimizer step over a batch of micro-batches [M, ...]: (params, opt_state, metrics).

    The gradients of the summed losses are accumulated over the micro-batches and divided by
    the batch's real target tokens, however it was split.
    """
    key = jax.random.fold_in(base_key, step)
    loss_fn = functools.partial(summed_loss, graphdef, label_smoothing, keep)

    def accumulate(carry, inputs):
        grads, sums = carry
        micro, index = inputs
        (loss_sum, aux), g = jax.value_and_grad(loss_fn, has_aux=True)(
            params, micro, jax.random.fold_in(key, index)
        )
        grads = jax.tree.map(jnp.add, grads, g)
        return (grads, sums + jnp.stack([loss_sum, *aux])), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    num_micro = batch.src.shape[0]
    (grads, sums), _ = jax.lax.scan(
        accumulate, (zeros, jnp.zeros(4)), (batch, jnp.arange(num_micro))
    )
    loss_sum, nll_sum, count, correct = sums
    # Mean over every real target token of the whole batch, however it was split.
    grads = jax.tree.map(lambda g: g / jnp.maximum(count, 1.0), grads)
    grad_norm = optax.global_norm(grads)
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    # A non-finite loss or gradient never reaches the parameters or Adam's moments: the
    # step keeps the old state and reports itself, and the host stops or counts it.
    finite = jnp.isfinite(loss_sum) & jnp.isfinite(grad_norm)
    params, opt_state = jax.tree.map(
        lambda new, old: jnp.where(finite, new, old),
        (optax.apply_updates(params, updates), new_opt_state),
        (params, opt_state),
    )
    metrics = {
        "loss_sum": loss_sum,
        "nll_sum": nll_sum,
        "tokens": count,
        "correct": correct,
        "grad_norm": grad_norm,
        "nonfinite": 1.0 - finite.astype(jnp.float32),
    }
    return params, opt_state, metrics


def packed_steps(step, ema_decay: float, steps_per_call: int, params, opt_state, *rest):
    """`step` on `Packed` state: one step, or `steps_per_call` of them in a `lax.scan` over
    stacked batches; with `ema_decay`, the moving average (the state after opt_state) updated
    after each. (params, opt_state, [ema,] batch(es), first step, key) -> (params, opt_state,
    [ema,] metrics)."""
    *ema, batches, first_step, base_key = rest
    if steps_per_call == 1:
        params, opt_state, metrics = step(
            params.tree(), opt_state.tree(), batches, first_step, base_key
        )
        nonfinite = metrics["nonfinite"]
        ema = [moving_average(ema_decay, e.tree(), params, first_step, nonfinite) for e in ema]
        return (*(Packed.of(x) for x in (params, opt_state, *ema)), metrics)

    def body(carry, inputs):
        batch, index = inputs
        params, opt_state, *ema = carry
        at = first_step + index
        params, opt_state, metrics = step(params, opt_state, batch, at, base_key)
        if ema:
            ema = [moving_average(ema_decay, ema[0], params, at, metrics["nonfinite"])]
        return (params, opt_state, *ema), metrics

    carry = tuple(x.tree() for x in (params, opt_state, *ema))
    carry, metrics = jax.lax.scan(body, carry, (batches, jnp.arange(steps_per_call)))
    return (*(Packed.of(x) for x in carry), metrics)


def ema_decay_at(decay: float, step):
    """The moving average's decay after update `step` (0 the first): `decay`, less while few
    updates have been averaged, so the random initialisation fades fast."""
    return jnp.minimum(decay, (1.0 + step) / (10.0 + step))


def moving_average(decay: float, ema, params, step, nonfinite):
    """The average after update `step` of `params` (traced): `make_ema_update`'s arithmetic."""
    d = ema_decay_at(decay, jnp.asarray(step, jnp.float32))
    new = jax.tree.map(lambda e, p: d * e + (1.0 - d) * p, ema, params)
    return jax.tree.map(lambda n, e: jnp.where(nonfinite > 0, e, n), new, ema)


def make_ema_update(decay: float, mesh):
    """The jitted (ema, params, step, nonfinite) -> ema of `train.ema_decay`:
    ema = d * ema + (1 - d) * params with d = `ema_decay_at(decay, step)`, the parameters
    being those after update `step`; a step that was not applied (`nonfinite`, the train
    step's metric) leaves the average as it was. The average is float32, like the parameters."""
    replicated = sharding.replicated(mesh)
    return jax.jit(
        lambda ema, params, step, nonfinite: moving_average(decay, ema, params, step, nonfinite),
        in_shardings=(replicated, replicated, None, replicated),
        out_shardings=replicated,
        donate_argnums=(0,),
    )


def make_eval_step(graphdef, label_smoothing: float, mesh, keep: str = "exp"):
    def eval_step(params, batch):
        model = nnx.merge(graphdef, params)
        micro = jax.tree.map(lambda x: x[0], batch)
        weights = (micro.tgt_segments > 0).astype(jnp.float32)
        loss_sum, nll_sum, count, _ = projected_cross_entropy(
            model.hidden(micro).astype(model.product_dtype),
            model.embed.embedding[...],
            micro.tgt_out,
            weights,
            label_smoothing,
            keep,
            model.output_bias(),
        )
        return jnp.stack([loss_sum, nll_sum, count])

    replicated = sharding.replicated(mesh)
    return jax.jit(
        eval_step,
        in_shardings=(replicated, sharding.batch_sharding(mesh)),
        out_shardings=replicated,
    )


class Steps(NamedTuple):
    """The trainer's jitted functions for one config, vocabulary and mesh (`make_steps`)."""

    graphdef: nnx.GraphDef
    # key -> (params, opt_state), created with their shardings.
    init: Callable
    # (params, opt_state, batch, step, dropout key) -> (params, opt_state, metrics).
    train: Callable
    # (params, batch) -> [loss sum, nll sum, target tokens] of its first micro-batch.
    eval: Callable
    # step -> learning rate.
    schedule: optax.Schedule
    # (ema, params, step, nonfinite) -> ema with train.ema_decay; None without. Takes and
    # returns pytrees of any kind, `Packed` ones too.
    ema: Callable | None = None
    # `train` on `Packed` parameters and Adam state: what the trainer and the benchmark call.
    packed_train: Callable | None = None
    # With train.ema_decay, `packed_train` and `ema` in one call (the trainer's step):
    # (params, opt_state, ema, batch, step, dropout key) -> (params, opt_state, ema, metrics),
    # all three states `Packed`; None without.
    packed_train_ema: Callable | None = None
    # With make_steps' steps_per_call K > 1: K steps of the trainer's step (`packed_train_ema`
    # with the average, else `packed_train`) in one call, on K stacked batches
    # (`make_train_step`'s docstring); None for K = 1.
    packed_train_many: Callable | None = None


def resolve_loss_keep(name: str, mesh) -> str:
    """`train.loss_keep` for the mesh's devices: "auto" becomes "exp" on CPUs, else "logits"."""
    return loss_keep(mesh.devices.flat[0].platform) if name == "auto" else name


def make_steps(
    config: Config, vocab_size: int, mesh, optimizer=None, steps_per_call: int = 1
) -> Steps:
    """Assembles the model's graph, the optimizer and the jitted steps, once.

    `optimizer` replaces the paper's Adam and schedule (tests use plain SGD); the schedule is
    then the config's all the same, for logging.
    """
    graphdef, _ = abstract_model(config, vocab_size)
    adam, schedule = make_optimizer(config)
    optimizer = adam if optimizer is None else optimizer
    smoothing = config.train.label_smoothing
    keep = resolve_loss_keep(config.train.loss_keep, mesh)
    decay = config.train.ema_decay
    return Steps(
        graphdef,
        make_init(config, vocab_size, optimizer, mesh),
        make_train_step(graphdef, optimizer, smoothing, mesh, keep),
        make_eval_step(graphdef, smoothing, mesh, keep),
        schedule,
        make_ema_update(decay, mesh) if decay else None,
        make_train_step(graphdef, optimizer, smoothing, mesh, keep, packed=True),
        make_train_step(graphdef, optimizer, smoothing, mesh, keep, True, decay) if decay else None,
        make_train_step(graphdef, optimizer, smoothing, mesh, keep, True, decay, steps_per_call)
        if steps_per_call > 1
        else None,
    )


def dev_loss(
    eval_step, params, corpus: TokenizedCorpus, layout: BatchLayout, mesh, row_slice: slice
) -> dict[str, float]:
    single = BatchLayout(layout.row_len, layout.rows, 1)
    totals = sum(
        np.asarray(
            eval_step(params, sharding.put_batch(make_batch(corpus, rows, single, row_slice), mesh))
        )
        for rows in plan_epoch(corpus, single, seed=0, epoch=0)
    )
    tokens = max(float(totals[2]), 1.0)
    return {"eval/loss": float(totals[0]) / tokens, "eval/nll": float(totals[1]) / tokens}
