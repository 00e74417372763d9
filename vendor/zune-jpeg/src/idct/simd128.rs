//! Wasm `simd128` IDCT (added by HAPI-rs; not in upstream zune-jpeg 0.5.15).
//!
//! The same integer transform as [`scalar::idct_int`](super::scalar::idct_int) and
//! [`scalar::idct4x4`](super::scalar::idct4x4), bit for bit: each pass takes eight i16x8
//! vectors (one lane per column, then per row after a transpose) and forms its sums of
//! products with `i32x4.dot_i16x8_s`, exact in i32. The scalar code's products by shared
//! factors (`p5`, `p1` ...) are regrouped per pair of inputs, the same integers.
//!
//! That holds while the dequantised coefficients and the first pass's outputs fit in i16
//! (within ±16383 for the full transform, which adds pairs of inputs in i16), as they do for
//! the blocks an encoder writes from 8-bit samples. A block outside that range (only a crafted
//! file has one) goes to the scalar code before anything is written.

use core::arch::wasm32::*;

use crate::idct::scalar::{idct4x4, idct_int};

/// Rounding and the +128 level shift of the second pass, as in the scalar code.
const SCALE_BITS: i32 = 512 + 65536 + (128 << 17);

/// `(a, b)` repeated in every pair of i16 lanes, the multipliers of a dot product.
#[inline(always)]
fn pair(a: i16, b: i16) -> v128 {
    i16x8(a, b, a, b, a, b, a, b)
}

/// Lanes 0-3 of `a` and `b`, interleaved.
#[inline(always)]
fn lo16(a: v128, b: v128) -> v128 {
    i16x8_shuffle::<0, 8, 1, 9, 2, 10, 3, 11>(a, b)
}

/// Lanes 4-7 of `a` and `b`, interleaved.
#[inline(always)]
fn hi16(a: v128, b: v128) -> v128 {
    i16x8_shuffle::<4, 12, 5, 13, 6, 14, 7, 15>(a, b)
}

/// An 8x8 transpose of i16 lanes.
#[inline(always)]
fn transpose(r: [v128; 8]) -> [v128; 8] {
    let a0 = lo16(r[0], r[1]);
    let a1 = hi16(r[0], r[1]);
    let a2 = lo16(r[2], r[3]);
    let a3 = hi16(r[2], r[3]);
    let a4 = lo16(r[4], r[5]);
    let a5 = hi16(r[4], r[5]);
    let a6 = lo16(r[6], r[7]);
    let a7 = hi16(r[6], r[7]);

    let b0 = i32x4_shuffle::<0, 4, 1, 5>(a0, a2);
    let b1 = i32x4_shuffle::<2, 6, 3, 7>(a0, a2);
    let b2 = i32x4_shuffle::<0, 4, 1, 5>(a1, a3);
    let b3 = i32x4_shuffle::<2, 6, 3, 7>(a1, a3);
    let b4 = i32x4_shuffle::<0, 4, 1, 5>(a4, a6);
    let b5 = i32x4_shuffle::<2, 6, 3, 7>(a4, a6);
    let b6 = i32x4_shuffle::<0, 4, 1, 5>(a5, a7);
    let b7 = i32x4_shuffle::<2, 6, 3, 7>(a5, a7);

    [
        i64x2_shuffle::<0, 2>(b0, b4),
        i64x2_shuffle::<1, 3>(b0, b4),
        i64x2_shuffle::<0, 2>(b1, b5),
        i64x2_shuffle::<1, 3>(b1, b5),
        i64x2_shuffle::<0, 2>(b2, b6),
        i64x2_shuffle::<1, 3>(b2, b6),
        i64x2_shuffle::<0, 2>(b3, b7),
        i64x2_shuffle::<1, 3>(b3, b7),
    ]
}

/// `dot(a, k)` on both halves.
#[inline(always)]
fn dot(a: (v128, v128), k: v128) -> (v128, v128) {
    (i32x4_dot_i16x8(a.0, k), i32x4_dot_i16x8(a.1, k))
}

#[inline(always)]
fn add(a: (v128, v128), b: (v128, v128)) -> (v128, v128) {
    (i32x4_add(a.0, b.0), i32x4_add(a.1, b.1))
}

#[inline(always)]
fn sub(a: (v128, v128), b: (v128, v128)) -> (v128, v128) {
    (i32x4_sub(a.0, b.0), i32x4_sub(a.1, b.1))
}

/// The lanes of `a` and `b` interleaved, as (lanes 0-3, lanes 4-7): the operand of [`dot`].
#[inline(always)]
fn zip(a: v128, b: v128) -> (v128, v128) {
    (lo16(a, b), hi16(a, b))
}

/// `x << 12` in i32.
#[inline(always)]
fn widen_shl12(x: v128) -> (v128, v128) {
    (i32x4_shl(i32x4_extend_low_i16x8(x), 12), i32x4_shl(i32x4_extend_high_i16x8(x), 12))
}

/// `(a + b) >> SHIFT` and `(a - b) >> SHIFT`, narrowed to i16 with saturation (the rounding
/// bias is already in `a`).
#[inline(always)]
fn butterfly<const SHIFT: u32>(a: (v128, v128), b: (v128, v128)) -> (v128, v128) {
    let (s, d) = (add(a, b), sub(a, b));
    (
        i16x8_narrow_i32x4(i32x4_shr(s.0, SHIFT), i32x4_shr(s.1, SHIFT)),
        i16x8_narrow_i32x4(i32x4_shr(d.0, SHIFT), i32x4_shr(d.1, SHIFT)),
    )
}

/// A pass's eight outputs, in butterfly pairs, from its even terms `x` and odd terms `y`.
#[inline(always)]
fn outputs<const SHIFT: u32>(x: [(v128, v128); 4], y: [(v128, v128); 4]) -> [v128; 8] {
    let (o0, o7) = butterfly::<SHIFT>(x[0], y[3]);
    let (o1, o6) = butterfly::<SHIFT>(x[1], y[2]);
    let (o2, o5) = butterfly::<SHIFT>(x[2], y[1]);
    let (o3, o4) = butterfly::<SHIFT>(x[3], y[0]);
    [o0, o1, o2, o3, o4, o5, o6, o7]
}

/// One 1-D pass over the eight inputs `c[k]` (frequency k, one lane per column or row). The
/// sums `c0 ± c4`, `c1 + c7` and `c3 + c5` are formed in i16: every input must be within
/// ±16383 (checked by the caller).
///
/// Scalar code: even part t0 = (c0 + c4) << 12, t1 = (c0 - c4) << 12,
/// t2 = (c2 + c6) * 2217 - c6 * 7567, t3 = (c2 + c6) * 2217 + c2 * 3135; x0 = t0 + t3,
/// x1 = t1 + t2, x2 = t1 - t2, x3 = t0 - t3. Odd part, with p5 = (c1 + c3 + c5 + c7) * 4816:
/// y0 = c7 * 1223 + p5 - (c7 + c1) * 3685 - (c7 + c3) * 8034, and so on; here the shared
/// products are regrouped into pairs of inputs, each pair one `dot`.
#[inline(always)]
fn pass<const SHIFT: u32>(c: &[v128; 8], bias: i32) -> [v128; 8] {
    let bias = i32x4_splat(bias);
    let biased = |x: (v128, v128)| (i32x4_add(x.0, bias), i32x4_add(x.1, bias));

    let c26 = zip(c[2], c[6]);
    let t2 = dot(c26, pair(2217, 2217 - 7567));
    let t3 = dot(c26, pair(2217 + 3135, 2217));
    let t0 = biased(widen_shl12(i16x8_add(c[0], c[4])));
    let t1 = biased(widen_shl12(i16x8_sub(c[0], c[4])));
    let x = [add(t0, t3), add(t1, t2), sub(t1, t2), sub(t0, t3)];

    let c73 = zip(c[7], c[3]);
    let c51 = zip(c[5], c[1]);
    let s = zip(i16x8_add(c[1], c[7]), i16x8_add(c[3], c[5]));
    let s0 = dot(s, pair(4816 - 3685, 4816));
    let s1 = dot(s, pair(4816, 4816 - 10497));
    let y = [
        add(dot(c73, pair(1223 - 8034, -8034)), s0),
        add(dot(c51, pair(8410 - 1597, -1597)), s1),
        add(dot(c73, pair(-8034, 12586 - 8034)), s1),
        add(dot(c51, pair(-1597, 6149 - 1597)), s0),
    ];
    outputs::<SHIFT>(x, y)
}

/// [`pass`] where inputs 4-7 are zero (the decoder's 4x4 blocks): `c` holds inputs 0-3. The
/// scalar `idct4x4`'s terms, one `dot` each; no sum in i16, so inputs within ±32766 do.
#[inline(always)]
fn pass_4x4<const SHIFT: u32>(c: &[v128; 4], bias: i32) -> [v128; 8] {
    let bias = i32x4_splat(bias);
    let c02 = zip(c[0], c[2]);
    let even = |k0: i16, k2: i16| {
        let x = dot(c02, pair(k0, k2));
        (i32x4_add(x.0, bias), i32x4_add(x.1, bias))
    };
    let x = [even(4096, 5352), even(4096, 2217), even(4096, -2217), even(4096, -5352)];
    let c13 = zip(c[1], c[3]);
    let y = [
        dot(c13, pair(1131, -3218)),
        dot(c13, pair(3219, -5681)),
        dot(c13, pair(4816, -1129)),
        dot(c13, pair(5683, 4816)),
    ];
    outputs::<SHIFT>(x, y)
}

/// The largest |lane| of `v` and `acc`, as u16 (|-32768| is 32768).
#[inline(always)]
fn max_abs(acc: v128, v: v128) -> v128 {
    u16x8_max(acc, i16x8_abs(v))
}

/// The IDCT of one block: `in_vector` (dequantised coefficients, row-major) to 8x8 samples at
/// `out_vector[row * stride..][..8]`, clamped to 0-255. `in_vector` is left as it is.
pub fn idct_simd128(in_vector: &mut [i32; 64], out_vector: &mut [i16], stride: usize) {
    if !idct::<false>(in_vector, out_vector, stride) {
        idct_int(in_vector, out_vector, stride);
    }
}

/// [`idct_simd128`] for a block whose coefficients outside the top-left 4x4 are zero, the
/// decoder's promise for this function; the scalar `idct4x4` is `idct_int` with those terms
/// dropped, the same integers. `in_vector` keeps that shape, as the decoder expects; so does
/// the fallback, the scalar `idct4x4`.
pub fn idct_simd128_4x4(in_vector: &mut [i32; 64], out_vector: &mut [i16], stride: usize) {
    if !idct::<true>(in_vector, out_vector, stride) {
        idct4x4(in_vector, out_vector, stride);
    }
}

/// Whether [`idct_simd128`] (`four`: [`idct_simd128_4x4`]) runs the SIMD code for this block,
/// not the scalar fallback (for `crate::hapi_kernels`' checks).
pub fn takes_simd_path(in_vector: &[i32; 64], four: bool) -> bool {
    let mut out = [0_i16; 64];
    if four {
        idct::<true>(in_vector, &mut out, 8)
    } else {
        idct::<false>(in_vector, &mut out, 8)
    }
}

/// The IDCT of one block (`FOUR`: only its top-left 4x4 coefficients can be non-zero).
/// Returns false, having written nothing, where an input of a pass is out of its range (only
/// a crafted file has such a block); the caller then runs the scalar code.
#[inline(always)]
fn idct<const FOUR: bool>(in_vector: &[i32; 64], out_vector: &mut [i16], stride: usize) -> bool {
    let load = |k: usize| {
        // SAFETY: `in_vector` has 64 i32s; row k < 8 is the 32 bytes from element 8k.
        // `v128_load` has no alignment requirement.
        let (a, b) = unsafe {
            let p = in_vector.as_ptr().add(8 * k).cast::<v128>();
            (v128_load(p), v128_load(p.add(1)))
        };
        // Saturating: a coefficient beyond i16 shows as ±32767/-32768, which the check catches.
        i16x8_narrow_i32x4(a, b)
    };
    let mut big = u16x8_splat(0);
    // Vertical pass (one lane per column).
    let cols = if FOUR {
        let rows = [load(0), load(1), load(2), load(3)];
        for r in &rows {
            big = max_abs(big, *r);
        }
        pass_4x4::<10>(&rows, 512)
    } else {
        let rows = [load(0), load(1), load(2), load(3), load(4), load(5), load(6), load(7)];
        for r in &rows {
            big = max_abs(big, *r);
        }
        pass::<10>(&rows, 512)
    };
    for v in &cols {
        big = max_abs(big, *v);
    }
    // `pass` adds pairs of inputs in i16 (both passes' inputs are checked here: the second's
    // are the first's outputs); `pass_4x4` adds none, but a narrowed value can be saturated.
    let limit = if FOUR { 32767 } else { 16384 };
    if v128_any_true(u16x8_ge(big, u16x8_splat(limit))) {
        return false;
    }

    // Horizontal pass (one lane per row after the transpose), the +128 level shift and the
    // clamp to 0-255, then back to rows.
    let t = transpose(cols);
    let out = if FOUR {
        pass_4x4::<17>(&[t[0], t[1], t[2], t[3]], SCALE_BITS)
    } else {
        pass::<17>(&t, SCALE_BITS)
    };
    let (zero, max) = (i16x8_splat(0), i16x8_splat(255));
    let out = transpose(out.map(|v| i16x8_min(i16x8_max(v, zero), max)));

    if out_vector.len() >= 7 * stride + 8 {
        for (i, v) in out.iter().enumerate() {
            // SAFETY: row i's 8 samples end at i * stride + 8 <= 7 * stride + 8 <= the length.
            unsafe { v128_store(out_vector.as_mut_ptr().add(i * stride).cast::<v128>(), *v) };
        }
    } else {
        // As the scalar code does: rows beyond the buffer (a damaged file) are dropped.
        for (i, v) in out.iter().enumerate() {
            if let Some(dst) = out_vector.get_mut(i * stride..i * stride + 8) {
                let mut lanes = [0_i16; 8];
                // SAFETY: `lanes` is 16 bytes.
                unsafe { v128_store(lanes.as_mut_ptr().cast::<v128>(), *v) };
                dst.copy_from_slice(&lanes);
            }
        }
    }
    true
}
