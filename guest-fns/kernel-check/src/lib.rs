//! Test guest: the Wasm SIMD kernels in `vendor/zune-jpeg` against the scalar code they stand
//! in for, inside the host's engine (Cranelift's code, as the guests run them). Random blocks
//! of dequantised coefficients, dense and sparse, from a few levels to `i32`'s whole range,
//! full and 4x4, into rows of several strides and into buffers too short for them; random
//! YCbCr triples, in range and any `i16`. Option `seed` (default 1) and `blocks` (per kind,
//! default 20000). It answers a line of counts (`u8` tensor, UTF-8): how many of each were
//! checked, how many took the SIMD code rather than its scalar fallback, and how many
//! differed, with the first difference.

#[allow(clippy::too_many_arguments)] // generated bindings
mod bindings {
    wit_bindgen::generate!({
        world: "pushdown",
        path: "../../wit",
        generate_all,
        pub_export_macro: true,
    });
}

use bindings::hapi::pushdown::types::{ElementType, Output, TensorOut};
use bindings::{Error, Guest, Invocation};
use zune_jpeg::hapi_kernels as k;

/// xorshift64: the same sequence for the same seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `[-mag - 1, mag]`.
    fn signed(&mut self, mag: u32) -> i32 {
        let span = 2 * u64::from(mag) + 2;
        (self.next() % span) as i64 as i32 - (mag as i32) - 1
    }
}

#[derive(Default)]
struct Counts {
    checked: u64,
    simd: u64,
    differ: u64,
    first: Option<String>,
}

impl Counts {
    fn record(&mut self, simd: bool, same: bool, what: impl FnOnce() -> String) {
        self.checked += 1;
        self.simd += u64::from(simd);
        if !same {
            self.differ += 1;
            self.first.get_or_insert_with(what);
        }
    }

    fn line(&self, name: &str) -> String {
        let mut line = format!(
            "{name}={} {name}_simd={} {name}_differ={}",
            self.checked, self.simd, self.differ
        );
        if let Some(first) = &self.first {
            line.push_str(&format!(" {name}_first=[{first}]"));
        }
        line
    }
}

/// One block: each of `1 + pct / 100 * 63` positions filled, magnitude up to `mag`; `four`: only
/// the top-left 4x4, as the decoder promises its 4x4 function.
fn block(rng: &mut Rng, mag: u32, pct: u64, four: bool) -> [i32; 64] {
    let mut c = [0_i32; 64];
    for (i, v) in c.iter_mut().enumerate() {
        if four && (i % 8 >= 4 || i / 8 >= 4) {
            continue;
        }
        if i == 0 || rng.next() % 100 < pct {
            *v = rng.signed(mag);
        }
    }
    c
}

fn check_idct(rng: &mut Rng, blocks: u64, four: bool) -> Counts {
    let mut counts = Counts::default();
    // Magnitudes: a photo's (most of them), up to where the SIMD code hands over, and beyond.
    let kinds: [(u32, u64); 8] = [
        (2, 40),
        (64, 30),
        (1024, 15),
        (1024, 100),
        (4096, 30),
        (16383, 20),
        (40_000, 20),
        (i32::MAX as u32, 20),
    ];
    for n in 0..blocks {
        let (mag, pct) = kinds[(n % kinds.len() as u64) as usize];
        let c = block(rng, mag, pct, four);
        let stride = 8 * (1 + (rng.next() % 3) as usize);
        // Every 16th block into a buffer too short for its last rows (a damaged file's).
        let len = if n % 16 == 15 {
            (rng.next() % (7 * stride as u64 + 8)) as usize
        } else {
            7 * stride + 8
        };
        let (mut a, mut b) = (vec![-1_i16; len], vec![-1_i16; len]);
        let (mut ca, mut cb) = (c, c);
        let simd = k::takes_simd_path(&c, four);
        if four {
            k::idct4x4(&mut ca, &mut a, stride);
            k::idct_simd128_4x4(&mut cb, &mut b, stride);
        } else {
            k::idct_int(&mut ca, &mut a, stride);
            k::idct_simd128(&mut cb, &mut b, stride);
        }
        // The 4x4 function must leave the coefficients outside the top-left 4x4 zero.
        let shape_kept = !four
            || cb
                .iter()
                .enumerate()
                .all(|(i, v)| *v == 0 || (i % 8 < 4 && i / 8 < 4));
        counts.record(simd, a == b && shape_kept, || {
            format!("coefficients {c:?} stride {stride} len {len}")
        });
    }
    counts
}

fn check_colour(rng: &mut Rng, calls: u64) -> Counts {
    let mut counts = Counts::default();
    for n in 0..calls {
        let mut px = [[0_i16; 16]; 3];
        for plane in &mut px {
            for v in plane.iter_mut() {
                *v = match n % 3 {
                    0 => (rng.next() % 256) as i16,
                    1 => rng.signed(200) as i16 + 100,
                    _ => rng.next() as i16,
                };
            }
        }
        let at = (rng.next() % 5) as usize;
        let (mut a, mut b) = (vec![7_u8; at + 48 + 3], vec![7_u8; at + 48 + 3]);
        let (mut pa, mut pb) = (at, at);
        k::ycbcr_to_rgb_inner_16_scalar::<false>(&px[0], &px[1], &px[2], &mut a, &mut pa);
        k::ycbcr_to_rgb_simd128(&px[0], &px[1], &px[2], &mut b, &mut pb);
        counts.record(true, a == b && pa == pb, || {
            format!("y {:?} cb {:?} cr {:?}", px[0], px[1], px[2])
        });
    }
    counts
}

struct KernelCheck;

impl Guest for KernelCheck {
    fn run(inv: Invocation) -> Result<Output, Error> {
        let number = |key: &str, default: u64| -> Result<u64, Error> {
            match inv.options.iter().find(|(k, _)| k == key) {
                None => Ok(default),
                Some((_, v)) => v
                    .parse()
                    .map_err(|_| Error::BadRequest(format!("option `{key}`: not a number: {v}"))),
            }
        };
        let mut rng = Rng(number("seed", 1)?.max(1));
        let blocks = number("blocks", 20_000)?;
        let line = [
            check_idct(&mut rng, blocks, false).line("idct"),
            check_idct(&mut rng, blocks, true).line("idct4x4"),
            check_colour(&mut rng, blocks).line("colour"),
        ]
        .join(" ");
        Ok(Output::Bytes(TensorOut {
            dimensions: vec![line.len() as u32],
            ty: ElementType::U8,
            data: line.into_bytes(),
        }))
    }
}

bindings::export!(KernelCheck with_types_in bindings);
