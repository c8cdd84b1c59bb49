"""Numbers in the model: the compute dtype, products with bfloat16 operands, linear layers.

translate/models/factory.py resolves the compute dtype for the device once and passes it to
every block; nothing here asks the hardware.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from translate.config import MatmulDtype, ModelConfig, check_choice


def compute_dtype(config: ModelConfig) -> Any:
    """The dtype `model.compute_dtype` names, where that needs no device: "auto" is float32.

    translate/models/factory.py resolves "auto" for the device (bfloat16 on GPUs and TPUs) and
    passes the dtype in; a model built directly, as tests do, computes in float32.
    """
    return jnp.dtype("float32" if config.compute_dtype == "auto" else config.compute_dtype)


# `model.matmul_dtype` -> the dtype float32 operands of a product are rounded to, or None:
# the operands keep the compute dtype.
ROUNDED_OPERANDS: dict[str, Any] = {"compute": None, "bfloat16": jnp.bfloat16}


def product_dtype(config: ModelConfig, dtype: Any) -> Any:
    """The operands' dtype of the linear layers' and the projection's products: `dtype`, the
    compute dtype, unless `model.matmul_dtype` rounds float32 operands to bfloat16."""
    matmul = check_choice(config.matmul_dtype, MatmulDtype, "model.matmul_dtype")
    rounded = ROUNDED_OPERANDS[matmul]
    if rounded is not None and jnp.dtype(dtype) == jnp.float32:
        return jnp.dtype(rounded)
    return jnp.dtype(dtype)


@jax.custom_vjp
def bfloat16_product(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., I] @ w [I, O] with both rounded to bfloat16, accumulated and returned in float32.

    The gradient's two products round the incoming gradient to bfloat16 as well, so all three
    products of a linear layer run at the bfloat16 rate; what they return is float32.
    """
    return _bfloat16_product_fwd(x, w)[0]


def _bfloat16_product_fwd(x, w):
    xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    return jnp.einsum("...i,io->...o", xb, wb, preferred_element_type=jnp.float32), (xb, wb)


def _bfloat16_product_bwd(residuals, g):
    xb, wb = residuals
    gb = g.astype(jnp.bfloat16)
    dx = jnp.einsum("...o,io->...i", gb, wb, preferred_element_type=jnp.float32)  # [..., I]
    dw = jnp.einsum("...i,...o->io", xb, gb, preferred_element_type=jnp.float32)  # [I, O]
    return dx.astype(jnp.float32), dw


bfloat16_product.defvjp(_bfloat16_product_fwd, _bfloat16_product_bwd)


def bfloat16_dot_general(x, w, dimension_numbers, precision=None, **kwargs):
    """nnx.Linear's product, x [..., I] @ w [I, O], through `bfloat16_product`."""
    assert dimension_numbers == (((x.ndim - 1,), (0,)), ((), ())), dimension_numbers
    return bfloat16_product(x, w)


def xavier_linear(
    config: ModelConfig,
    d_in: int,
    d_out: int,
    dtype: Any,
    rngs: nnx.Rngs,
    use_bias: bool = True,
) -> nnx.Linear:
    """A linear layer; its product takes bfloat16 operands where `model.matmul_dtype` says so.

    It has a bias where `use_bias` and `model.use_bias` both say so.
    """
    bfloat16 = product_dtype(config, dtype) != jnp.dtype(dtype)
    return nnx.Linear(
        d_in,
        d_out,
        use_bias=use_bias and config.use_bias,
        dtype=dtype,
        rngs=rngs,
        kernel_init=nnx.initializers.xavier_uniform(),
        **({"dot_general": bfloat16_dot_general} if bfloat16 else {}),
    )
