//! Wasm `simd128` YCbCr to RGB (added by HAPI-rs; not in upstream zune-jpeg 0.5.15).
//!
//! Bit for bit [`ycbcr_to_rgb_inner_16_scalar`](super::scalar::ycbcr_to_rgb_inner_16_scalar)
//! for RGB: the same 14-bit coefficients, each channel's sum of products formed exactly in
//! i32 with `i32x4.dot_i16x8_s` (`Cb - 128` and `Cr - 128` wrap in i16 as the scalar code's
//! do), shifted, then saturated to i16 and to u8, which is the scalar code's clamp to 0-255.

use core::arch::wasm32::*;

use crate::color_convert::scalar::{
    CB_CF, CR_CF, C_G_CB_COEF_2, C_G_CR_COEF_1, YUV_PREC, YUV_RND, Y_CF
};

/// `(a, b)` repeated in every pair of i16 lanes, the multipliers of a dot product.
#[inline(always)]
fn pair(a: i16, b: i16) -> v128 {
    i16x8(a, b, a, b, a, b, a, b)
}

/// One channel of 8 pixels: `(dot(a, k) + extra) >> YUV_PREC` on the interleaved halves of
/// `a`, where `extra` gives each half's remaining terms; saturated to i16.
#[inline(always)]
fn channel(a: (v128, v128), k: v128, extra: (v128, v128)) -> v128 {
    let shift = YUV_PREC as u32;
    i16x8_narrow_i32x4(
        i32x4_shr(i32x4_add(i32x4_dot_i16x8(a.0, k), extra.0), shift),
        i32x4_shr(i32x4_add(i32x4_dot_i16x8(a.1, k), extra.1), shift),
    )
}

/// R, G and B of 8 pixels as i16 lanes, before the clamp.
#[inline(always)]
fn rgb8(y: v128, cb: v128, cr: v128) -> [v128; 3] {
    let lo = |a, b| i16x8_shuffle::<0, 8, 1, 9, 2, 10, 3, 11>(a, b);
    let hi = |a, b| i16x8_shuffle::<4, 12, 5, 13, 6, 14, 7, 15>(a, b);
    let half = i16x8_splat(128);
    let (cb, cr) = (i16x8_sub(cb, half), i16x8_sub(cr, half));
    let ycr = (lo(y, cr), hi(y, cr));
    let ycb = (lo(y, cb), hi(y, cb));
    // G's third term and the rounding constant together: (Cb, 1) . (coefficient, rounding).
    let one = i16x8_splat(1);
    let cb1 = (lo(cb, one), hi(cb, one));
    let g_extra = pair(C_G_CB_COEF_2, YUV_RND);
    let rnd = i32x4_splat(i32::from(YUV_RND));
    [
        channel(ycr, pair(Y_CF, CR_CF), (rnd, rnd)),
        channel(
            ycr,
            pair(Y_CF, C_G_CR_COEF_1),
            (i32x4_dot_i16x8(cb1.0, g_extra), i32x4_dot_i16x8(cb1.1, g_extra)),
        ),
        channel(ycb, pair(Y_CF, CB_CF), (rnd, rnd)),
    ]
}

/// Converts 16 pixels of YCbCr to RGB at `output[*pos..*pos + 48]` and advances `pos`.
pub fn ycbcr_to_rgb_simd128(
    y: &[i16; 16], cb: &[i16; 16], cr: &[i16; 16], output: &mut [u8], pos: &mut usize
) {
    let out = output
        .get_mut(*pos..*pos + 48)
        .expect("Slice to small cannot write");
    let load = |s: &[i16; 16], i: usize| {
        // SAFETY: `s` has 16 i16s and i is 0 or 8: the 16 bytes from element i are in bounds.
        // `v128_load` has no alignment requirement.
        unsafe { v128_load(s.as_ptr().add(i).cast::<v128>()) }
    };
    let [r0, g0, b0] = rgb8(load(y, 0), load(cb, 0), load(cr, 0));
    let [r1, g1, b1] = rgb8(load(y, 8), load(cb, 8), load(cr, 8));
    // The clamp to 0-255: i16 to u8 with unsigned saturation.
    let r = u8x16_narrow_i16x8(r0, r1);
    let g = u8x16_narrow_i16x8(g0, g1);
    let b = u8x16_narrow_i16x8(b0, b1);

    // Interleave: rg_lo = r0 g0 r1 g1 .. r7 g7, rg_hi the same for pixels 8-15, then B in.
    let rg_lo = i8x16_shuffle::<0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23>(r, g);
    let rg_hi =
        i8x16_shuffle::<8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31>(r, g);
    let v0 = i8x16_shuffle::<0, 1, 16, 2, 3, 17, 4, 5, 18, 6, 7, 19, 8, 9, 20, 10>(rg_lo, b);
    let mid =
        i8x16_shuffle::<11, 0, 12, 13, 0, 14, 15, 0, 16, 17, 0, 18, 19, 0, 20, 21>(rg_lo, rg_hi);
    let v1 = i8x16_shuffle::<0, 21, 2, 3, 22, 5, 6, 23, 8, 9, 24, 11, 12, 25, 14, 15>(mid, b);
    let v2 = i8x16_shuffle::<26, 6, 7, 27, 8, 9, 28, 10, 11, 29, 12, 13, 30, 14, 15, 31>(rg_hi, b);

    // SAFETY: `out` is 48 bytes; the three stores cover bytes 0-15, 16-31 and 32-47.
    // `v128_store` has no alignment requirement.
    unsafe {
        let p = out.as_mut_ptr().cast::<v128>();
        v128_store(p, v0);
        v128_store(p.add(1), v1);
        v128_store(p.add(2), v2);
    }
    *pos += 48;
}
