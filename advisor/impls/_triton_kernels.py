"""Triton implicit-GEMM convolution kernels: forward, grad input, grad weight.

Every conv is handled as 3-D (1-D and 2-D come in with unit depth/height), every tensor is read
and written through its strides (so NCDHW and channels-last both work) and every load and store is
masked, so any shape is correct. Accumulation is fp32.

Do not import this module directly: `triton.jit` decides at decoration time whether a kernel is
compiled or interpreted (TRITON_INTERPRET), so `advisor.impls.triton_conv` loads this file lazily,
once per interpreter setting.

GEMM views (per group g; G = groups, CGI/CGO = in/out channels per group):
- forward:     y[m, co]  = sum_{kpos, ci} x_patch[m, kpos, ci] * w[co, ci, kpos],  m = (n, od, oh, ow)
- grad input:  gx[m, ci] = sum_{kpos, co} gy_scatter[m, kpos, co] * w[co, ci, kpos], m = (n, d, h, w)
- grad weight: gw[co, ci, kpos] = sum_{p} gy[p, co] * x_patch[p, kpos, ci],          p = (n, od, oh, ow)
Only builtins of triton.language are used, none of its @jit helpers (tl.zeros, tl.cdiv, ...):
those are decorated when triton is first imported, so if TRITON_INTERPRET is set only after that,
they are compiled functions the interpreter cannot call.

The kernel position loops are outermost so the spatial bounds are computed once per position and
the channel loads are contiguous for channels-last tensors.
"""

from __future__ import annotations

import triton
import triton.language as tl

from advisor.allowance import checkpoint
from advisor.impls.triton_configs import GEMM_TILES, WGRAD_TILES, Tile, gemm_pruner, prune_wgrad

INTERPRET: bool = bool(triton.knobs.runtime.interpret)


def _configs(tiles: list[Tile], interpreted: tuple[int, int, int]) -> list[triton.Config]:
    # The interpreter runs each program in Python: one config (autotuning would only cost time),
    # with big blocks, since its cost is per operation per program, hardly per element.
    if INTERPRET:
        tiles = [(*interpreted, 1, 1)]
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
        for m, n, k, w, s in tiles
    ]


_GEMM_CONFIGS = _configs(GEMM_TILES, interpreted=(64, 32, 32))
_WGRAD_CONFIGS = _configs(WGRAD_TILES, interpreted=(32, 32, 64))
_FWD_KEY = ["M", "CGI", "CGO", "KD", "KH", "KW", "HAS_BIAS", "PRECISION"]
_WGRAD_KEY = ["P", "CGI", "CGO", "KD", "KH", "KW", "SPLIT", "PRECISION"]
# Integer args Triton should not specialise (by default it compiles a variant per arg == 1 and
# per arg % 16 == 0: triton/runtime/jit.py create_function_from_signature -> specialize_impl).
# Only sizes of the outer spatial dims (depth, height), their kernel sizes and pads: they enter
# index math and bounds along rows whose values are constant within a vector, never the
# alignment of the axis that is contiguous in memory (W in NCHW, channels in channels-last).
# W, OW, KW, PW, M, P, CGI, CGO, strides, dilations and the tensor strides stay specialised:
# Triton's axis analysis reads their divisibility (or == 1) to vectorise loads and stores.
_NO_SPECIALIZE = ["D", "H", "OD", "OH", "KD", "KH", "PD", "PH"]


@triton.autotune(
    pre_hook=checkpoint,  # the first call's allowance, met off the main thread too
    configs=_GEMM_CONFIGS,
    key=_FWD_KEY,
    prune_configs_by={"early_config_prune": gemm_pruner(n="CGO", k="CGI")},
)
@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def conv_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr,
    M, D, H, W, OD, OH, OW,
    KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW,
    CGI, CGO,
    sxn, sxc, sxd, sxh, sxw,
    swo, swc, swd, swh, sww,
    syn, syc, syd, syh, syw,
    HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    g = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < CGO
    ow = offs_m % OW
    t = offs_m // OW
    oh = t % OH
    t = t // OH
    od = t % OD
    nb = t // OD
    co = g * CGO + offs_n
    x_base = x_ptr + nb.to(tl.int64) * sxn + (g * CGI).to(tl.int64) * sxc
    w_base = w_ptr + co.to(tl.int64) * swo
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for kd in range(KD):
        i_d = od * SD - PD + kd * DD
        ok_d = m_mask & (i_d >= 0) & (i_d < D)
        for kh in range(KH):
            i_h = oh * SH - PH + kh * DH
            ok_h = ok_d & (i_h >= 0) & (i_h < H)
            for kw in range(KW):
                i_w = ow * SW - PW + kw * DW
                ok = ok_h & (i_w >= 0) & (i_w < W)
                x_sp = x_base + (
                    i_d.to(tl.int64) * sxd + i_h.to(tl.int64) * sxh + i_w.to(tl.int64) * sxw
                )
                w_sp = w_base + (kd * swd + kh * swh + kw * sww)
                for c0 in range(0, CGI, BLOCK_K):
                    offs_k = c0 + tl.arange(0, BLOCK_K)
                    k_mask = offs_k < CGI
                    a = tl.load(
                        x_sp[:, None] + offs_k[None, :] * sxc,
                        mask=ok[:, None] & k_mask[None, :],
                        other=0.0,
                    )
                    b = tl.load(
                        w_sp[None, :] + offs_k[:, None] * swc,
                        mask=k_mask[:, None] & n_mask[None, :],
                        other=0.0,
                    )
                    if UPCAST:
                        a = a.to(tl.float32)
                        b = b.to(tl.float32)
                    acc = tl.dot(a, b, acc, input_precision=PRECISION)
    if HAS_BIAS:
        bias = tl.load(b_ptr + co, mask=n_mask, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    y_off = (
        nb.to(tl.int64) * syn + od.to(tl.int64) * syd + oh.to(tl.int64) * syh
        + ow.to(tl.int64) * syw
    )  # fmt: skip
    y_ptrs = y_ptr + y_off[:, None] + co.to(tl.int64)[None, :] * syc
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.autotune(
    pre_hook=checkpoint,  # the first call's allowance, met off the main thread too
    configs=_GEMM_CONFIGS,
    key=_FWD_KEY,
    prune_configs_by={"early_config_prune": gemm_pruner(n="CGI", k="CGO")},
)
@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def conv_dgrad_kernel(
    gy_ptr, w_ptr, b_ptr, gx_ptr,
    M, D, H, W, OD, OH, OW,
    KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW,
    CGI, CGO,
    sgn, sgc, sgd, sgh, sgw,
    swo, swc, swd, swh, sww,
    sxn, sxc, sxd, sxh, sxw,
    HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # M runs over input positions (n, d, h, w); N over input channels of the group; the reduction
    # over output channels of the group, for every kernel position that maps this input position
    # onto an output position (i + pad - k * dil divisible by the stride and in range).
    # HAS_BIAS adds b[ci]: transposed convs run their forward through this kernel.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    g = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < CGI
    iw = offs_m % W
    t = offs_m // W
    ih = t % H
    t = t // H
    i_d = t % D
    nb = t // D
    ci = g * CGI + offs_n
    gy_base = gy_ptr + nb.to(tl.int64) * sgn + (g * CGO).to(tl.int64) * sgc
    w_base = w_ptr + offs_n.to(tl.int64) * swc + (g * CGO).to(tl.int64) * swo
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for kd in range(KD):
        td = i_d + PD - kd * DD
        td = tl.where(td >= 0, td, 0)  # keep // and % away from negatives; masked below anyway
        o_d = td // SD
        ok_d = m_mask & (i_d + PD - kd * DD >= 0) & (td % SD == 0) & (o_d < OD)
        for kh in range(KH):
            th = ih + PH - kh * DH
            th = tl.where(th >= 0, th, 0)
            o_h = th // SH
            ok_h = ok_d & (ih + PH - kh * DH >= 0) & (th % SH == 0) & (o_h < OH)
            for kw in range(KW):
                tw = iw + PW - kw * DW
                tw = tl.where(tw >= 0, tw, 0)
                o_w = tw // SW
                ok = ok_h & (iw + PW - kw * DW >= 0) & (tw % SW == 0) & (o_w < OW)
                gy_sp = gy_base + (
                    o_d.to(tl.int64) * sgd + o_h.to(tl.int64) * sgh + o_w.to(tl.int64) * sgw
                )
                w_sp = w_base + (kd * swd + kh * swh + kw * sww)
                for c0 in range(0, CGO, BLOCK_K):
                    offs_k = c0 + tl.arange(0, BLOCK_K)
                    k_mask = offs_k < CGO
                    a = tl.load(
                        gy_sp[:, None] + offs_k[None, :] * sgc,
                        mask=ok[:, None] & k_mask[None, :],
                        other=0.0,
                    )
                    b = tl.load(
                        w_sp[None, :] + offs_k[:, None] * swo,
                        mask=k_mask[:, None] & n_mask[None, :],
                        other=0.0,
                    )
                    if UPCAST:
                        a = a.to(tl.float32)
                        b = b.to(tl.float32)
                    acc = tl.dot(a, b, acc, input_precision=PRECISION)
    if HAS_BIAS:
        bias = tl.load(b_ptr + ci, mask=n_mask, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    x_off = (
        nb.to(tl.int64) * sxn + i_d.to(tl.int64) * sxd + ih.to(tl.int64) * sxh
        + iw.to(tl.int64) * sxw
    )  # fmt: skip
    gx_ptrs = gx_ptr + x_off[:, None] + ci.to(tl.int64)[None, :] * sxc
    tl.store(gx_ptrs, acc.to(gx_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.autotune(
    pre_hook=checkpoint,  # the first call's allowance, met off the main thread too
    configs=_WGRAD_CONFIGS,
    key=_WGRAD_KEY,
    prune_configs_by={"early_config_prune": prune_wgrad},
)
@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def conv_wgrad_kernel(
    x_ptr, gy_ptr, part_ptr,
    P, D, H, W, OD, OH, OW,
    KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW,
    CGI, CGO, G, SPLIT,
    sxn, sxc, sxd, sxh, sxw,
    sgn, sgc, sgd, sgh, sgw,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # M: output channels of the group; N: input channels of the group; one kernel position per
    # program (axis 1); the reduction over output positions p is split SPLIT ways (axis 2 carries
    # group and split), each split writing its own fp32 partial: no atomics, deterministic.
    pid = tl.program_id(0)
    kpos = tl.program_id(1)
    g = tl.program_id(2) % G
    split = tl.program_id(2) // G
    num_n = (CGI + BLOCK_N - 1) // BLOCK_N
    pid_m = pid // num_n
    pid_n = pid % num_n
    kw = kpos % KW
    kh = (kpos // KW) % KH
    kd = kpos // (KW * KH)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < CGO
    n_mask = offs_n < CGI
    co = g * CGO + offs_m
    ci = g * CGI + offs_n
    chunk = ((P + SPLIT - 1) // SPLIT + BLOCK_K - 1) // BLOCK_K * BLOCK_K
    p_start = split * chunk
    p_stop = tl.minimum(p_start + chunk, P)
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
    for p0 in range(p_start, p_stop, BLOCK_K):
        offs_p = p0 + tl.arange(0, BLOCK_K)
        p_mask = offs_p < p_stop
        ow = offs_p % OW
        t = offs_p // OW
        oh = t % OH
        t = t // OH
        od = t % OD
        nb = t // OD
        i_d = od * SD - PD + kd * DD
        i_h = oh * SH - PH + kh * DH
        i_w = ow * SW - PW + kw * DW
        ok = p_mask & (i_d >= 0) & (i_d < D) & (i_h >= 0) & (i_h < H) & (i_w >= 0) & (i_w < W)
        nb64 = nb.to(tl.int64)
        gy_off = nb64 * sgn + od.to(tl.int64) * sgd + oh.to(tl.int64) * sgh + ow.to(tl.int64) * sgw
        x_off = (
            nb64 * sxn + i_d.to(tl.int64) * sxd + i_h.to(tl.int64) * sxh
            + i_w.to(tl.int64) * sxw
        )  # fmt: skip
        a = tl.load(
            gy_ptr + co.to(tl.int64)[:, None] * sgc + gy_off[None, :],
            mask=m_mask[:, None] & p_mask[None, :],
            other=0.0,
        )
        b = tl.load(
            x_ptr + x_off[:, None] + ci.to(tl.int64)[None, :] * sxc,
            mask=ok[:, None] & n_mask[None, :],
            other=0.0,
        )
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    # partial layout: (SPLIT, C_out, CGI, KD*KH*KW), contiguous fp32
    kk = KD * KH * KW
    part_off = (
        split.to(tl.int64) * (G * CGO) * CGI * kk
        + co.to(tl.int64)[:, None] * (CGI * kk)
        + offs_n[None, :] * kk
        + kpos
    )
    tl.store(part_ptr + part_off, acc, mask=m_mask[:, None] & n_mask[None, :])
