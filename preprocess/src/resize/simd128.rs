//! The two passes' inner loops in Wasm SIMD (`simd128`), for the guests.
//!
//! Natively LLVM vectorises the portable loops well for x86; under wasmtime the same loops,
//! vectorised by LLVM for `simd128` and compiled again by Cranelift, ran at about a third of the
//! native speed (`cargo xtask bench host`'s preprocessing column, and a `perf` profile with
//! `HAPI_WASM_PROFILER=perfmap`). These kernels keep the accumulators in registers across all
//! taps of a pixel and do four multiply-adds per instruction. The arithmetic is the portable
//! loops' exactly: integer sums (any order gives the same result), then Pillow's `clip8`, which
//! equals an arithmetic shift by [`PRECISION_BITS`] followed by saturation to 0..=255.

use super::{HALF, PRECISION_BITS, clip8};
use core::arch::wasm32::*;

/// `clip8` of four accumulators, as four i32 lanes in 0..=255.
#[inline(always)]
fn shifted(acc: v128) -> v128 {
    i32x4_shr(acc, PRECISION_BITS)
}

/// 16 lanes of `clip8`: shift, then saturate i32 -> i16 -> u8 (negative -> 0, > 255 -> 255).
#[inline(always)]
fn clip16(a: [v128; 4]) -> v128 {
    let lo = i16x8_narrow_i32x4(shifted(a[0]), shifted(a[1]));
    let hi = i16x8_narrow_i32x4(shifted(a[2]), shifted(a[3]));
    u8x16_narrow_i16x8(lo, hi)
}

/// 16 bytes of `s` from `at`, unaligned.
#[inline(always)]
fn load16(s: &[u8], at: usize) -> v128 {
    let s = &s[at..at + 16];
    // SAFETY: `s` is 16 readable bytes (checked by the slice above); Wasm loads may be
    // unaligned.
    unsafe { v128_load(s.as_ptr().cast()) }
}

/// One output row of the vertical pass: `dst[i] = clip8(HALF + sum_j lines[j][i] * k[j])`.
/// Every line is at least `dst.len()` bytes. Common tap counts run a copy of the loop with the
/// count fixed, which LLVM unrolls: a loop in the Wasm code is an epoch check at its header
/// each time round under wasmtime, the taps' loop one per tap and 16 pixels.
pub(super) fn vertical_row(lines: &[&[u8]], k: &[i32], dst: &mut [u8]) {
    // A slice of a literal length: the taps' loop has a known count once inlined.
    macro_rules! fixed {
        ($($n:literal)*) => {
            match k.len().min(lines.len()) {
                $($n => vertical_blocks(&lines[..$n], &k[..$n], dst),)*
                _ => vertical_blocks(lines, k, dst),
            }
        };
    }
    fixed!(1 2 3 4 5 6 7 8);
    let n = dst.len();
    for (i, d) in dst.iter_mut().enumerate().skip(n / 16 * 16) {
        let acc = lines
            .iter()
            .zip(k)
            .fold(HALF, |acc, (line, &kj)| acc + i32::from(line[i]) * kj);
        *d = clip8(acc);
    }
}

/// The whole 16-pixel blocks of [`vertical_row`] (inlined, so that a literal number of taps
/// unrolls their loop).
#[inline(always)]
fn vertical_blocks(lines: &[&[u8]], k: &[i32], dst: &mut [u8]) {
    for b in 0..dst.len() / 16 {
        let at = b * 16;
        let mut acc = [i32x4_splat(HALF); 4];
        for (line, &kj) in lines.iter().zip(k) {
            add_tap(&mut acc, line, at, kj);
        }
        store16(dst, at, acc);
    }
}

/// `acc[..] += line[at..at + 16] * kj`, 16 pixels as four i32x4.
#[inline(always)]
fn add_tap(acc: &mut [v128; 4], line: &[u8], at: usize, kj: i32) {
    let v = load16(line, at);
    let kk = i32x4_splat(kj);
    let lo = u16x8_extend_low_u8x16(v);
    let hi = u16x8_extend_high_u8x16(v);
    let wide = [
        u32x4_extend_low_u16x8(lo),
        u32x4_extend_high_u16x8(lo),
        u32x4_extend_low_u16x8(hi),
        u32x4_extend_high_u16x8(hi),
    ];
    for (a, w) in acc.iter_mut().zip(wide) {
        *a = i32x4_add(*a, i32x4_mul(w, kk));
    }
}

/// `clip8` of 16 accumulators into `dst[at..at + 16]`.
#[inline(always)]
fn store16(dst: &mut [u8], at: usize, acc: [v128; 4]) {
    let out = &mut dst[at..at + 16];
    // SAFETY: `out` is 16 writable bytes; Wasm stores may be unaligned.
    unsafe { v128_store(out.as_mut_ptr().cast(), clip16(acc)) };
}

/// One output pixel of the horizontal pass over 3-channel pixels: `taps` holds the source
/// pixels its coefficients `k` apply to (3 bytes each) and at least one byte more, so that
/// each pixel can be read as 4 bytes.
#[inline(always)]
pub(super) fn horizontal_pixel3(taps: &[u8], k: &[i32], px: &mut [u8]) {
    let taps = &taps[..k.len() * 3 + 1];
    let mut acc = i32x4_splat(HALF);
    for (j, &kj) in k.iter().enumerate() {
        let p = &taps[j * 3..j * 3 + 4];
        // SAFETY: `p` is 4 readable bytes; Wasm loads may be unaligned.
        let v = unsafe { v128_load32_zero(p.as_ptr().cast()) };
        let v = u32x4_extend_low_u16x8(u16x8_extend_low_u8x16(v));
        acc = i32x4_add(acc, i32x4_mul(v, i32x4_splat(kj)));
    }
    let s = shifted(acc);
    let b = u8x16_narrow_i16x8(i16x8_narrow_i32x4(s, s), i16x8_narrow_i32x4(s, s));
    px[0] = u8x16_extract_lane::<0>(b);
    px[1] = u8x16_extract_lane::<1>(b);
    px[2] = u8x16_extract_lane::<2>(b);
}

/// The horizontal pass over 3-channel pixels, four output pixels at a time: for each group of
/// four, one 16-byte load per tap covers all four pixels' source pixels, a swizzle per i32x4
/// places each channel byte in its lane (r0 g0 b0 r1 | g1 b1 r2 g2 | b2 r3 g3 b3) and the
/// coefficients come as the matching lanes. Pixel i of a group reads source pixel `s_i + j` at
/// tap j, `s_i - s_0` bytes ahead of pixel 0's, the same for every tap and every row, so the
/// swizzles and coefficients are built once per resize. Taps past a pixel's own count have
/// coefficient 0 (the rows of [`super::Taps::k`] are zero-padded to `ksize`).
#[derive(Debug)]
pub(super) struct Groups {
    /// The groups that fit.
    groups: Vec<Group>,
    /// Per group and tap, the three coefficient vectors.
    coef: Vec<[v128; 3]>,
    /// Window-relative output pixels outside the groups that fit.
    rest: Vec<usize>,
}

/// Four output pixels computed together.
#[derive(Debug)]
struct Group {
    /// Its number: output pixels `4q..4q + 4` of the window.
    q: usize,
    /// Byte offset of pixel 0's first source pixel in a line.
    at: usize,
    /// The three swizzles.
    index: [v128; 3],
    /// Its taps' coefficient vectors in `Groups::coef`.
    taps: core::ops::Range<usize>,
}

impl Groups {
    /// The groups of output pixels `left..left + width` (window columns; `origin` is the first
    /// source pixel of a line, `line_len` its bytes) that fit: the four pixels' sources within
    /// 16 bytes, every tap's load inside the line. The rest (the last `width % 4` pixels, and
    /// groups that do not fit) go pixel by pixel.
    pub(super) fn new(
        taps: &super::Taps,
        origin: usize,
        line_len: usize,
        left: usize,
        width: usize,
    ) -> Groups {
        let mut g = Groups {
            groups: Vec::new(),
            coef: Vec::new(),
            rest: (width / 4 * 4..width).collect(),
        };
        for q in 0..width / 4 {
            let first = left + 4 * q;
            let starts: [usize; 4] = core::array::from_fn(|i| taps.bounds[first + i].0);
            let n = (0..4).map(|i| taps.bounds[first + i].1).max().unwrap_or(0);
            let s0 = starts[0];
            let fits = starts.iter().all(|&s| s >= s0 && (s - s0) * 3 + 2 < 16)
                && (s0 - origin + n) * 3 + 13 <= line_len;
            if !fits || n == 0 || n > taps.ksize {
                g.rest.extend(4 * q..4 * q + 4);
                continue;
            }
            let mut bytes = [[0xffu8; 16]; 3];
            let mut kv = vec![[[0i32; 4]; 3]; n];
            for l in 0..12 {
                let (i, c) = (l / 3, l % 3);
                bytes[l / 4][(l % 4) * 4] = ((starts[i] - s0) * 3 + c) as u8;
                let row = &taps.k[(first + i) * taps.ksize..][..taps.ksize];
                // Pixel i's tap j reads source pixel starts[i] + j.
                for (j, kj) in kv.iter_mut().enumerate() {
                    kj[l / 4][l % 4] = row[j];
                }
            }
            let start = g.coef.len();
            g.coef
                .extend(kv.iter().map(|k| k.map(|v| i32x4(v[0], v[1], v[2], v[3]))));
            g.groups.push(Group {
                q,
                at: (s0 - origin) * 3,
                index: bytes.map(|b| {
                    u8x16(
                        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                        b[12], b[13], b[14], b[15],
                    )
                }),
                taps: start..g.coef.len(),
            });
        }
        g
    }

    /// Output pixels (window-relative) that no group covers: compute them pixel by pixel.
    pub(super) fn rest(&self) -> &[usize] {
        &self.rest
    }

    /// Writes the output pixels of the groups that fit into `dst` (the row's output, 3 bytes
    /// per pixel) from `line`.
    pub(super) fn row(&self, line: &[u8], dst: &mut [u8]) {
        for g in &self.groups {
            let coef = &self.coef[g.taps.clone()];
            // As in `vertical_row`: common tap counts unrolled, no loop (epoch check) per tap.
            macro_rules! fixed {
                ($($n:literal)*) => {
                    match coef.len() {
                        $($n => group_sums(line, g, &coef[..$n]),)*
                        _ => group_sums(line, g, coef),
                    }
                };
            }
            let acc = fixed!(1 2 3 4 5 6 7 8);
            let lo = i16x8_narrow_i32x4(shifted(acc[0]), shifted(acc[1]));
            let hi = i16x8_narrow_i32x4(shifted(acc[2]), shifted(acc[2]));
            let b = u8x16_narrow_i16x8(lo, hi);
            let out = &mut dst[12 * g.q..12 * g.q + 12];
            // SAFETY: `out` is 12 writable bytes: 8 then 4 of them are stored.
            unsafe {
                v128_store64_lane::<0>(b, out.as_mut_ptr().cast());
                v128_store32_lane::<2>(b, out.as_mut_ptr().add(8).cast());
            }
        }
    }
}

/// One group's three channel accumulators over its taps (inlined, so that a literal number of
/// taps unrolls their loop).
#[inline(always)]
fn group_sums(line: &[u8], g: &Group, coef: &[[v128; 3]]) -> [v128; 3] {
    let mut acc = [i32x4_splat(HALF); 3];
    for (j, k) in coef.iter().enumerate() {
        let v = load16(line, g.at + 3 * j);
        for ((a, ix), kk) in acc.iter_mut().zip(&g.index).zip(k) {
            *a = i32x4_add(*a, i32x4_mul(i8x16_swizzle(v, *ix), *kk));
        }
    }
    acc
}
