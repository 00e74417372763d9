//! Resampling that gives Pillow's bytes, computed only where a crop will look.
//!
//! torchvision's `Resize` on a PIL image calls Pillow's `Image.resize`; a model trained with
//! torchvision preprocessing saw Pillow's resampler. This module computes the same thing bit
//! for bit (Pillow's `Resample.c`: a separable convolution, horizontal pass first, with
//! coefficients computed in f64 and applied in 22-bit fixed point, rounded and clipped to 8 bits
//! after each pass), for the two filters torchvision uses with antialiasing, bilinear and
//! bicubic.
//!
//! Only the crop window of the resized image is produced: the horizontal pass runs on the
//! source rows the window's output rows read, for the window's columns only, and the vertical
//! pass on the window's rows. Each output pixel depends on its own taps alone, so the window is
//! exactly that part of the full resize. The vertical pass is a row of multiply-adds over
//! contiguous bytes, which vectorises (SSE/AVX natively, `simd128` in the Wasm guest).

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod simd128;

/// Pillow's fixed-point precision for 8-bit images: 32 bits less 8 for the value and 2 for
/// the sign and headroom.
const PRECISION_BITS: u32 = 32 - 8 - 2;
const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// The resampling filter (Pillow's `Image.Resampling`, torchvision's `InterpolationMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Filter {
    /// Triangle filter, support 1 (scaled when reducing).
    #[default]
    Bilinear,
    /// Keys' cubic convolution with a = -0.5, support 2 (scaled when reducing).
    Bicubic,
}

impl Filter {
    fn support(self) -> f64 {
        match self {
            Filter::Bilinear => 1.0,
            Filter::Bicubic => 2.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        let x = x.abs();
        match self {
            Filter::Bilinear => {
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Filter::Bicubic => {
                const A: f64 = -0.5;
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
        }
    }
}

/// The fixed-point taps of a 1-D resampling from `in_size` to `out_size` samples.
#[derive(Debug)]
struct Taps {
    /// Per output sample: first input sample and number of taps.
    bounds: Vec<(usize, usize)>,
    /// `ksize` coefficients per output sample (unused ones zero).
    k: Vec<i32>,
    ksize: usize,
}

impl Taps {
    /// Pillow's `precompute_coeffs` over the whole input (box [0, in_size)) followed by
    /// `normalize_coeffs_8bpc`.
    fn new(in_size: usize, out_size: usize, filter: Filter) -> Taps {
        let scale = in_size as f64 / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = filter.support() * filterscale;
        let ksize = support.ceil() as usize * 2 + 1;
        let mut bounds = Vec::with_capacity(out_size);
        let mut k = vec![0i32; out_size * ksize];
        let mut w = vec![0f64; ksize];
        for (xx, kx) in k.chunks_exact_mut(ksize).enumerate() {
            let center = (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filterscale;
            // C casts truncate toward zero; both ends are clamped to the input.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64).max(0) as usize;
            let n = xmax.saturating_sub(xmin).min(ksize);
            let mut total = 0.0;
            for (x, wx) in w[..n].iter_mut().enumerate() {
                *wx = filter.weight(((x + xmin) as f64 - center + 0.5) * ss);
                total += *wx;
            }
            for (kx, &wx) in kx.iter_mut().zip(&w[..n]) {
                let v = if total != 0.0 { wx / total } else { wx };
                let fixed = v * f64::from(1u32 << PRECISION_BITS);
                *kx = if v < 0.0 {
                    (-0.5 + fixed) as i32
                } else {
                    (0.5 + fixed) as i32
                };
            }
            bounds.push((xmin, n));
        }
        Taps { bounds, k, ksize }
    }

    fn of(&self, i: usize) -> (usize, &[i32]) {
        let (start, n) = self.bounds[i];
        (start, &self.k[i * self.ksize..][..n])
    }
}

#[inline(always)]
fn clip8(v: i32) -> u8 {
    if v >= (1 << PRECISION_BITS << 8) {
        255
    } else if v <= 0 {
        0
    } else {
        (v >> PRECISION_BITS) as u8
    }
}

/// A window of the resized image: columns `left..left + width`, rows `top..top + height`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub left: usize,
    pub top: usize,
    pub width: usize,
    pub height: usize,
}

/// Resizes an interleaved 8-bit image of `C` channels (`src`, `w` x `h`) to `out_w` x `out_h`
/// as Pillow does, and returns the pixels of `window` of the result (interleaved, row-major).
///
/// The passes run in Pillow 13's order: vertical first when the height shrinks by more than
/// twice as many pixels as the width does, horizontal first otherwise (Pillow 12 and earlier
/// always ran the horizontal pass first; the two orders differ by one level on some pixels).
/// With torchvision's aspect-keeping `Resize`, only portrait images over twice as tall as wide
/// that are reduced take the vertical-first order.
///
/// Panics if `src` is not `w * h * C` bytes or the window is not inside the output; callers
/// check sizes first.
pub fn resize_window<const C: usize>(
    src: &[u8],
    (w, h): (usize, usize),
    (out_w, out_h): (usize, usize),
    win: Window,
    filter: Filter,
) -> Vec<u8> {
    assert_eq!(src.len(), w * h * C, "source is not {w}x{h}x{C}");
    assert!(
        win.left + win.width <= out_w && win.top + win.height <= out_h,
        "window {win:?} is outside {out_w}x{out_h}"
    );
    let horiz = (out_w != w).then(|| Taps::new(w, out_w, filter));
    let vert = (out_h != h).then(|| Taps::new(h, out_h, filter));
    // The source rows the window's output rows read, and the columns its columns read.
    let span = |taps: &Option<Taps>, first: usize, n: usize| match taps {
        Some(t) => {
            let (last_start, last_n) = t.bounds[first + n - 1];
            (t.bounds[first].0, last_start + last_n)
        }
        None => (first, first + n),
    };
    let rows = span(&vert, win.top, win.height);
    let cols = span(&horiz, win.left, win.width);
    let shrink_h = h as i64 - out_h as i64;
    let shrink_w = w as i64 - out_w as i64;
    let horizontal_first = !(shrink_h > 0 && shrink_h > shrink_w * 2);
    if horizontal_first {
        // Source rows `rows`, window columns; then the window's rows.
        let tmp = horizontal_pass::<C>(src, (w, 0), rows, &horiz, win.left, win.width);
        let cols = (0, win.width);
        vertical_pass::<C>(&tmp, win.width, cols, rows.0, &vert, win.top, win.height)
    } else {
        // Window rows over source columns `cols`; then the window's columns.
        let width = cols.1 - cols.0;
        let tmp = vertical_pass::<C>(src, w, cols, 0, &vert, win.top, win.height);
        let rows = (0, win.height);
        horizontal_pass::<C>(&tmp, (width, cols.0), rows, &horiz, win.left, win.width)
    }
}

/// Rows `rows` of `src` resampled horizontally (or copied when `taps` is `None`), output
/// columns `left..left + width`. Each row of `src` is `w` pixels, source columns from `origin`.
fn horizontal_pass<const C: usize>(
    src: &[u8],
    (w, origin): (usize, usize),
    rows: (usize, usize),
    taps: &Option<Taps>,
    left: usize,
    width: usize,
) -> Vec<u8> {
    let row_len = width * C;
    let mut out = vec![0u8; (rows.1 - rows.0) * row_len];
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if let (3, Some(t)) = (C, taps) {
        let groups = simd128::Groups::new(t, origin, w * C, left, width);
        for (r, dst) in out.chunks_exact_mut(row_len).enumerate() {
            let line = line_of(src, w * C, rows.0 + r);
            groups.row(line, dst);
            for &xx in groups.rest() {
                horizontal_pixel::<C>(line, origin, t, left + xx, &mut dst[xx * C..][..C]);
            }
        }
        return out;
    }
    for (r, dst) in out.chunks_exact_mut(row_len).enumerate() {
        let line = line_of(src, w * C, rows.0 + r);
        match taps {
            Some(t) => {
                for (xx, px) in dst.chunks_exact_mut(C).enumerate() {
                    horizontal_pixel::<C>(line, origin, t, left + xx, px);
                }
            }
            None => dst.copy_from_slice(&line[(left - origin) * C..][..row_len]),
        }
    }
    out
}

/// Output rows `top..top + height` resampled vertically (or copied when `taps` is `None`),
/// over columns `cols.0..cols.1` of `src`, whose rows are `stride` pixels long and whose first
/// row is source row `first_row`.
fn vertical_pass<const C: usize>(
    src: &[u8],
    stride: usize,
    cols: (usize, usize),
    first_row: usize,
    taps: &Option<Taps>,
    top: usize,
    height: usize,
) -> Vec<u8> {
    let row_len = (cols.1 - cols.0) * C;
    let line = |row: usize| &line_of(src, stride * C, row - first_row)[cols.0 * C..][..row_len];
    let mut out = vec![0u8; height * row_len];
    let Some(taps) = taps else {
        for (yy, dst) in out.chunks_exact_mut(row_len).enumerate() {
            dst.copy_from_slice(line(top + yy));
        }
        return out;
    };
    let mut lines: Vec<&[u8]> = Vec::with_capacity(taps.ksize);
    let mut acc = vec![0i32; row_len];
    for (yy, dst) in out.chunks_exact_mut(row_len).enumerate() {
        let (start, k) = taps.of(top + yy);
        lines.clear();
        lines.extend((start..start + k.len()).map(line));
        vertical_row(&lines, k, &mut acc, dst);
    }
    out
}

/// One output row of the vertical pass: `dst[i] = clip8(HALF + sum_j lines[j][i] * k[j])`.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
fn vertical_row(lines: &[&[u8]], k: &[i32], _acc: &mut [i32], dst: &mut [u8]) {
    simd128::vertical_row(lines, k, dst);
}

/// One output row of the vertical pass: `dst[i] = clip8(HALF + sum_j lines[j][i] * k[j])`,
/// with `acc` (as long as `dst`) for the sums. Contiguous multiply-adds across the row: LLVM
/// vectorises this loop natively.
#[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
fn vertical_row(lines: &[&[u8]], k: &[i32], acc: &mut [i32], dst: &mut [u8]) {
    acc.fill(HALF);
    for (line, &kj) in lines.iter().zip(k) {
        for (a, &v) in acc.iter_mut().zip(*line) {
            *a += i32::from(v) * kj;
        }
    }
    for (d, &a) in dst.iter_mut().zip(&*acc) {
        *d = clip8(a);
    }
}

fn line_of(buf: &[u8], len: usize, row: usize) -> &[u8] {
    &buf[row * len..][..len]
}

/// Output pixel `x` of the horizontal pass from `line`, which holds source columns from
/// `origin` on.
#[inline(always)]
fn horizontal_pixel<const C: usize>(
    line: &[u8],
    origin: usize,
    taps: &Taps,
    x: usize,
    px: &mut [u8],
) {
    let (start, k) = taps.of(x);
    let taps_src = &line[(start - origin) * C..];
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    if C == 3 && taps_src.len() > k.len() * 3 {
        simd128::horizontal_pixel3(taps_src, k, px);
        return;
    }
    let mut acc = [HALF; C];
    for (p, &kj) in taps_src[..k.len() * C].chunks_exact(C).zip(k) {
        for c in 0..C {
            acc[c] += i32::from(p[c]) * kj;
        }
    }
    for c in 0..C {
        px[c] = clip8(acc[c]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_size_is_the_identity_for_both_filters() {
        let src: Vec<u8> = (0..7 * 5 * 3).map(|i| (i * 37 % 251) as u8).collect();
        let win = Window {
            left: 0,
            top: 0,
            width: 7,
            height: 5,
        };
        for f in [Filter::Bilinear, Filter::Bicubic] {
            assert_eq!(resize_window::<3>(&src, (7, 5), (7, 5), win, f), src);
        }
    }

    #[test]
    fn taps_of_an_unchanged_axis_are_one_and_zero() {
        // An axis whose size does not change is skipped, which is only right if its taps are
        // the identity: weight 1.0 on the sample itself, 0 elsewhere.
        for f in [Filter::Bilinear, Filter::Bicubic] {
            let taps = Taps::new(9, 9, f);
            for i in 0..9 {
                let (start, k) = taps.of(i);
                for (j, &kj) in k.iter().enumerate() {
                    let want = if start + j == i {
                        1 << PRECISION_BITS
                    } else {
                        0
                    };
                    assert_eq!(kj, want, "{f:?} output {i} tap {j}");
                }
            }
        }
    }

    #[test]
    fn a_window_is_exactly_that_part_of_the_whole() {
        let (w, h) = (37, 23);
        let src: Vec<u8> = (0..w * h * 3).map(|i| (i * 7919 % 256) as u8).collect();
        // (40, 5) and (30, 4) shrink the height most: the vertical pass runs first.
        for (ow, oh) in [(91, 57), (16, 11), (37, 50), (40, 5), (30, 4)] {
            for f in [Filter::Bilinear, Filter::Bicubic] {
                let whole = resize_window::<3>(
                    &src,
                    (w, h),
                    (ow, oh),
                    Window {
                        left: 0,
                        top: 0,
                        width: ow,
                        height: oh,
                    },
                    f,
                );
                let win = Window {
                    left: ow / 5,
                    top: oh / 3,
                    width: ow / 2,
                    height: oh / 2,
                };
                let part = resize_window::<3>(&src, (w, h), (ow, oh), win, f);
                for y in 0..win.height {
                    let a = &whole[((win.top + y) * ow + win.left) * 3..][..win.width * 3];
                    assert_eq!(
                        &part[y * win.width * 3..][..win.width * 3],
                        a,
                        "{f:?} row {y}"
                    );
                }
            }
        }
    }

    #[test]
    fn uniform_images_stay_uniform() {
        for v in [0u8, 1, 128, 254, 255] {
            let src = vec![v; 13 * 9];
            for f in [Filter::Bilinear, Filter::Bicubic] {
                let win = Window {
                    left: 0,
                    top: 0,
                    width: 40,
                    height: 5,
                };
                let out = resize_window::<1>(&src, (13, 9), (40, 5), win, f);
                assert!(out.iter().all(|&o| o == v), "{f:?} {v}: {out:?}");
            }
        }
    }
}
