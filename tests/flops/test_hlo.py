"""traceflops.flops.hlo against counts worked out by hand in each test (2 FLOPs per multiply-add). No torch."""

from __future__ import annotations

import pytest

from traceflops.flops.hlo import HloFlops, convolution, dot, te_attention


def test_dot_is_two_flops_per_output_element_and_contracted_element():
    # [3, 7] = [3, 5] · [5, 7], contracting lhs dimension 1 (5)
    assert dot([3, 7], [3, 5], [1]) == 2 * 3*7 * 5
    # lhs [5, 3] transposed: the contracted dimension is 0, not the last one
    assert dot([3, 7], [5, 3], [0]) == 2 * 3*7 * 5
    # batch 2, two contracted dimensions (4 and 6): out [2, 3, 7], lhs [2, 3, 4, 6]
    assert dot([2, 3, 7], [2, 3, 4, 6], [2, 3]) == 2 * 2*3*7 * 4*6


def test_dot_dimension_numbers_that_do_not_fit_raise_index_error():
    with pytest.raises(IndexError):
        dot([3, 7], [3, 5], [2])


# One convolution, NHWC input [2, 9, 11, 3], HWIO kernel [3, 2, 3, 4] (input feature at index 2,
# spatial at 0 and 1), valid padding, stride 1: output NHWC [2, 7, 10, 4].
X, W, Y = [2, 9, 11, 3], [3, 2, 3, 4], [2, 7, 10, 4]
KIF, KSPATIAL = 2, [0, 1]
CONV = 2 * (2*7*10*4) * (3 * 3*2)  # 2 · output elements · (input features × window)


@pytest.mark.parametrize("target", ["", "__cudnn$convForward"])
def test_convolution_forward(target):
    assert convolution(target, Y, X, W, KIF, KSPATIAL) == CONV == 20160


def test_convolution_backward_input_and_filter_count_the_forward():
    # BackwardInput(d_out, kernel) -> d_in; BackwardFilter(input, d_out) -> d_kernel
    assert convolution("__cudnn$convBackwardInput", X, Y, W, KIF, KSPATIAL) == CONV
    assert convolution("__cudnn$convBackwardFilter", W, X, Y, KIF, KSPATIAL) == CONV
    # read as a forward, the same operands would give another count
    assert convolution("", X, Y, W, KIF, KSPATIAL) == 2 * (2*9*11*3) * (3 * 3*2) != CONV


def test_convolution_grouped_counts_the_input_features_per_group():
    # groups 3: input [1, 5, 5, 6], kernel HWIO [3, 3, 2, 9] (6 / 3 = 2 input features per group), out [1, 3, 3, 9]
    assert convolution("", [1, 3, 3, 9], [1, 5, 5, 6], [3, 3, 2, 9], 2, [0, 1]) == 2 * (1*3*3*9) * (2 * 3*3)


def test_convolution_dimension_numbers_that_do_not_fit_raise_index_error():
    with pytest.raises(IndexError):
        convolution("", Y, X, W, 4, KSPATIAL)


B, H, SQ, SK = 2, 4, 6, 10


def cfg(dq=8, dv=8, **extra):
    """Transformer Engine's backend config, as the xplane parser hands it over: every value text."""
    c = {"input_batch": B, "attn_heads": H, "q_max_seqlen": SQ, "kv_max_seqlen": SK, "qk_head_dim": dq, "v_head_dim": dv, **extra}
    return {k: str(v) for k, v in c.items()}


def test_te_attention_forward_and_backward():
    fwd = te_attention(cfg(), False, [B, SQ, H, 8])
    assert fwd == HloFlops(2 * B*H*SQ*SK * (8 + 8), 0, "none")
    assert fwd.flops == 4 * 2*4*6*10 * 8 == 15360
    bwd = te_attention(cfg(), True, [B, SQ, H, 8])
    assert bwd.flops * 2 == fwd.flops * 5  # backward = 2.5 × forward
    assert bwd == HloFlops(2 * B*H*SQ*SK * (3*8 + 2*8), 2 * B*H*SQ*SK * 8, "none")
    assert bwd.recompute == 2 * 2*4*6*10 * 8 == 7680  # the Q·Kᵀ recompute


def test_te_attention_with_other_value_head_dim():
    # Dqk 8, Dv 12: forward 2·B·H·Sq·Sk·(Dqk + Dv), backward 2·B·H·Sq·Sk·(3·Dqk + 2·Dv), recompute 2·B·H·Sq·Sk·Dqk
    assert te_attention(cfg(8, 12), False, [B, SQ, H, 12]) == HloFlops(2 * 480 * (8 + 12), 0, "none")
    assert te_attention(cfg(8, 12), True, [B, SQ, H, 12]) == HloFlops(2 * 480 * (3*8 + 2*12), 2 * 480 * 8, "none")


@pytest.mark.parametrize("mask_type,mask", [("0", "none"), ("1", "none"), ("2", "causal"), ("3", "causal"),
                                            ("4", "causal"), ("5", "causal"), (None, "none")])
def test_te_attention_mask_from_mask_type(mask_type, mask):
    c = cfg() if mask_type is None else cfg(mask_type=mask_type)
    for backward in (False, True):
        r = te_attention(c, backward, [B, SQ, H, 8])
        assert r.mask == mask
        # the count stays dense whatever the mask
        assert r.flops == 2 * B*H*SQ*SK * ((3*8 + 2*8) if backward else (8 + 8))


@pytest.mark.parametrize("out_dims", [None, [B, H, SQ, 8], [B, SQ, H, 12], [B, SK, H, 8], [B, SQ, H]])
def test_te_attention_output_that_does_not_match_the_config_is_none(out_dims):
    assert te_attention(cfg(), False, out_dims) is None
    assert te_attention(cfg(), True, out_dims) is None


def test_te_attention_config_missing_or_unreadable_is_none():
    c = cfg()
    del c["kv_max_seqlen"]
    assert te_attention(c, False, [B, SQ, H, 8]) is None
    assert te_attention(cfg(dq="eight"), False, [B, SQ, H, 8]) is None
