"""The norms of the Transformer's residual stream (Sec. 3.1): which one (`model.normalization`)
and where it sits around a sub-layer (`model.norm_position`), each a table keyed by the choice.

A room of its own below attention.py and layers.py, so that every block may build the model's
norm: the layers around their sub-layers, the stacks at their ends, and attention too (a norm
on its queries and keys would be one).
"""

from __future__ import annotations

from typing import Any

from flax import nnx

from translate.config import ModelConfig, Normalization, NormPosition, check_choice

Norm = nnx.LayerNorm | nnx.RMSNorm

# `model.normalization` -> the norm's class. LayerNorm is the paper's (Ba et al. 2016), a gain
# and a bias over the centred channels; RMSNorm (Zhang & Sennrich 2019) a gain alone, no mean
# taken.
NORMS: dict[str, type[Norm]] = {"layernorm": nnx.LayerNorm, "rmsnorm": nnx.RMSNorm}

# `model.norm_position` -> whether each norm sits before its sub-layer. "post" is the paper's
# LayerNorm(x + Sublayer(x)); "pre" is x + Sublayer(LayerNorm(x)) with a final norm on each
# stack (Xiong et al. 2020).
PRE_NORM: dict[str, bool] = {"post": False, "pre": True}

# Sec. 3.1 does not state LayerNorm's epsilon; tensor2tensor's 1e-6, for both norms.
EPSILON = 1e-6


def is_pre_norm(config: ModelConfig) -> bool:
    """Whether each norm sits before its sub-layer (`model.norm_position`)."""
    return PRE_NORM[check_choice(config.norm_position, NormPosition, "model.norm_position")]


def make_norm(config: ModelConfig, dtype: Any, rngs: nnx.Rngs) -> Norm:
    """The norm `model.normalization` names, over d_model channels, computing in `dtype`."""
    norm = NORMS[check_choice(config.normalization, Normalization, "model.normalization")]
    return norm(config.d_model, epsilon=EPSILON, dtype=dtype, rngs=rngs)
