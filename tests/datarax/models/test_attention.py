"""Attention kernels (datarax.models.attention): the blockwise (CPU flash) path equals dot
attention in values and gradients; kinds and platforms. The transformer's losses with each
kind are in test_transformer.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from datarax.models.attention import attention, blockwise_attention, dot_attention, platform_of


def test_blockwise_attention_equals_dot_for_several_blocks_and_grads():
    keys = jax.random.split(jax.random.key(1), 3)
    q = jax.random.normal(keys[0], (2, 64, 8, 16))
    k, v = (jax.random.normal(key, (2, 64, 2, 16)) for key in keys[1:])
    highest = jax.lax.Precision.HIGHEST
    want = dot_attention(q, k, v, precision=highest)
    for block in (8, 16, 64):
        got = blockwise_attention(q, k, v, precision=highest, block=block)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"block {block}")

    def total(fn):
        return jax.grad(lambda *a: jnp.sum(jnp.sin(fn(*a))), argnums=(0, 1, 2))

    dots = total(lambda *a: dot_attention(*a, precision=highest))(q, k, v)
    blocks = total(lambda *a: blockwise_attention(*a, precision=highest, block=16))(q, k, v)
    for got, want, name in zip(blocks, dots, "qkv", strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"d{name}")


def test_attention_dispatches_by_kind_and_refuses_others():
    keys = jax.random.split(jax.random.key(2), 3)
    q = jax.random.normal(keys[0], (1, 16, 4, 8))
    k, v = (jax.random.normal(key, (1, 16, 2, 8)) for key in keys[1:])
    highest = jax.lax.Precision.HIGHEST
    want = dot_attention(q, k, v, precision=highest)
    np.testing.assert_array_equal(attention("dot", q, k, v, precision=highest), want)
    flash = attention("flash", q, k, v, precision=highest)
    assert flash.shape == want.shape and flash.dtype == q.dtype
    np.testing.assert_allclose(flash, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="'paged' is not 'flash' or 'dot'"):
        attention("paged", q, k, v)


def test_block_must_divide_the_sequence_and_platform_defaults_to_jax():
    q = jnp.zeros((1, 12, 2, 4))
    with pytest.raises(ValueError, match="block 8 does not divide the sequence length 12"):
        blockwise_attention(q, q, q, block=8)
    assert platform_of(None) == jax.default_backend()
