//! Image preprocessing with one definition for both tiers.
//!
//! The Wasm pushdown guest (storage tier) and the trainer's no-pushdown baseline (compute tier)
//! both call this crate, so "decode, resize, crop, normalise" means the same thing bit for bit
//! on either side, and features do not depend on where they were computed.
//!
//! The pipeline is the usual ImageNet evaluation transform, as torchvision computes it on a PIL
//! image: decode (JPEG or PNG), resize so the shorter side is `resize` pixels (Pillow's
//! bilinear resampling with antialiasing, [`resize`]), take the centre `crop` x `crop` square,
//! scale to [0, 1] and normalise each channel with `(x - mean) / std`, laid out as CHW f32.
//! From the same decoded pixels the result equals torchvision's bit for bit. Only the crop
//! window is resampled. Grayscale images become three equal channels; they are resized as one
//! channel and replicated afterwards, which gives the same values for a third of the work.

pub mod resize;

use image::{DynamicImage, GrayImage, ImageFormat, ImageReader, Limits, RgbImage};
pub use resize::Filter;
use std::io::Cursor;
use std::mem::MaybeUninit;

/// Largest width or height accepted from a stored object. ImageNet photos are about 500 px;
/// this leaves room for large photos while a crafted header cannot claim gigapixels.
pub const MAX_IMAGE_SIDE: u32 = 8192;
/// Largest decoder allocation: an 8192 x 8192 RGBA image.
pub const MAX_DECODE_BYTES: u64 = 8192 * 8192 * 4;

/// The transform parameters (a model package's `input` section). [`Transform::new`] gives
/// torchvision's ImageNet recipe for the other settings: shorter side, bilinear, RGB, NCHW,
/// pixels in [0, 1].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Transform {
    /// The shorter side becomes `resize` (or both sides, with [`ResizeMode::Squash`]).
    pub resize: u32,
    /// Then the centre `crop` x `crop` square is taken.
    pub crop: u32,
    /// Per model input channel (in `channel_order`): `(x - mean) / std`, with x the pixel in
    /// `scale` units.
    pub mean: [f32; 3],
    pub std: [f32; 3],
    pub resize_mode: ResizeMode,
    pub filter: Filter,
    pub channel_order: ChannelOrder,
    pub layout: Layout,
    pub scale: Scale,
}

/// How the image reaches `resize` pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ResizeMode {
    /// The shorter side becomes `resize`, the aspect ratio is kept (torchvision `Resize(s)`).
    #[default]
    Shorter,
    /// Both sides become `resize`, the aspect ratio is not kept (`Resize((s, s))`).
    Squash,
}

/// The order of the model's input channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ChannelOrder {
    #[default]
    Rgb,
    Bgr,
}

/// The layout of one sample in the model's input tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Layout {
    /// Channels, height, width (PyTorch).
    #[default]
    Nchw,
    /// Height, width, channels (TensorFlow, many ONNX exports from it).
    Nhwc,
}

/// The unit of a pixel before normalisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Scale {
    /// [0, 1]: the 8-bit level divided by 255 (torchvision's `ToTensor`).
    #[default]
    Unit,
    /// [0, 255]: the 8-bit level itself.
    Byte,
}

macro_rules! named {
    ($ty:ident { $($variant:ident = $name:literal),+ $(,)? }) => {
        impl $ty {
            /// The name a manifest, the WIT and the command line use.
            pub fn name(self) -> &'static str {
                match self { $($ty::$variant => $name),+ }
            }
        }
        impl std::str::FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($name => Ok($ty::$variant),)+
                    _ => Err(format!(
                        "`{s}` is not one of {}",
                        [$($name),+].join(", ")
                    )),
                }
            }
        }
    };
}
named!(ResizeMode { Shorter = "shorter", Squash = "squash" });
named!(ChannelOrder { Rgb = "rgb", Bgr = "bgr" });
named!(Layout { Nchw = "nchw", Nhwc = "nhwc" });
named!(Filter { Bilinear = "bilinear", Bicubic = "bicubic" });

impl Scale {
    /// The pixel value of an 8-bit level's maximum: 1 or 255.
    pub fn max(self) -> f32 {
        match self {
            Scale::Unit => 1.0,
            Scale::Byte => 255.0,
        }
    }

    /// From 1 or 255.
    pub fn from_max(v: f32) -> Result<Self, String> {
        if v == 1.0 {
            Ok(Scale::Unit)
        } else if v == 255.0 {
            Ok(Scale::Byte)
        } else {
            Err(format!(
                "scale {v}: must be 1 (pixels in [0, 1]) or 255 (in [0, 255])"
            ))
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum PreprocessError {
    #[error("not a JPEG, PNG or WebP image")]
    UnknownFormat,
    #[error("cannot decode {format}: {message}")]
    Decode {
        format: &'static str,
        message: String,
    },
    #[error("image is {width}x{height}; each side must be 1..={MAX_IMAGE_SIDE} pixels")]
    BadSize { width: u32, height: u32 },
    #[error("bad transform: {0}")]
    BadTransform(String),
}

impl Transform {
    /// torchvision's ImageNet evaluation recipe with these sizes and statistics: shorter side
    /// to `resize` (bilinear, antialiased), centre crop, RGB, NCHW, pixels in [0, 1].
    pub const fn new(resize: u32, crop: u32, mean: [f32; 3], std: [f32; 3]) -> Self {
        Self {
            resize,
            crop,
            mean,
            std,
            resize_mode: ResizeMode::Shorter,
            filter: Filter::Bilinear,
            channel_order: ChannelOrder::Rgb,
            layout: Layout::Nchw,
            scale: Scale::Unit,
        }
    }

    /// A transform from a model's input description, whose mean and std come as lists (the
    /// WIT's `input-spec`): each must hold one value per channel. The other settings are
    /// [`Transform::new`]'s; set them on the result.
    pub fn from_lists(
        resize: u32,
        crop: u32,
        mean: &[f32],
        std: &[f32],
    ) -> Result<Self, PreprocessError> {
        let three = |v: &[f32], what: &str| {
            <[f32; 3]>::try_from(v).map_err(|_| {
                PreprocessError::BadTransform(format!("{what} has {} values, expected 3", v.len()))
            })
        };
        Ok(Self::new(
            resize,
            crop,
            three(mean, "mean")?,
            three(std, "std")?,
        ))
    }

    /// One sample's shape in the model's input: (3, crop, crop) or (crop, crop, 3).
    pub fn sample_shape(&self) -> [u32; 3] {
        match self.layout {
            Layout::Nchw => [3, self.crop, self.crop],
            Layout::Nhwc => [self.crop, self.crop, 3],
        }
    }

    fn check(&self) -> Result<(), PreprocessError> {
        if self.crop == 0 || self.resize < self.crop {
            return Err(PreprocessError::BadTransform(format!(
                "resize {} must be >= crop {} > 0",
                self.resize, self.crop
            )));
        }
        if self.std.iter().any(|s| !(*s > 0.0 && s.is_finite())) {
            return Err(PreprocessError::BadTransform(format!(
                "std {:?} must be positive",
                self.std
            )));
        }
        Ok(())
    }

    /// Elements of one preprocessed sample: 3 x crop x crop, in either layout.
    pub fn sample_len(&self) -> usize {
        3 * self.crop as usize * self.crop as usize
    }
}

/// A decoded image: 8-bit grayscale or 8-bit RGB.
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    Gray(GrayImage),
    Rgb(RgbImage),
}

impl Decoded {
    pub fn dimensions(&self) -> (u32, u32) {
        match self {
            Decoded::Gray(g) => g.dimensions(),
            Decoded::Rgb(c) => c.dimensions(),
        }
    }
}

/// Decodes a JPEG, PNG or WebP into 8-bit grayscale or RGB, with size and allocation limits.
pub fn decode(bytes: &[u8]) -> Result<Decoded, PreprocessError> {
    let (format, name) = match image::guess_format(bytes) {
        Ok(ImageFormat::Jpeg) => return decode_jpeg(bytes),
        Ok(ImageFormat::Png) => return decode_png(bytes),
        Ok(f @ ImageFormat::WebP) => (f, "WebP"),
        _ => return Err(PreprocessError::UnknownFormat),
    };
    let decode_err = |e: image::ImageError| PreprocessError::Decode {
        format: name,
        message: e.to_string(),
    };
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_IMAGE_SIDE);
    limits.max_image_height = Some(MAX_IMAGE_SIDE);
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    reader.limits(limits);
    let img = reader.decode().map_err(|e| match e {
        image::ImageError::Limits(_) => {
            match ImageReader::with_format(Cursor::new(bytes), format).into_dimensions() {
                Ok((width, height)) => PreprocessError::BadSize { width, height },
                Err(e) => decode_err(e),
            }
        }
        e => decode_err(e),
    })?;
    if img.width() == 0 || img.height() == 0 {
        return Err(PreprocessError::BadSize {
            width: img.width(),
            height: img.height(),
        });
    }
    Ok(narrow(img))
}

/// An image of any pixel type as 8-bit grayscale or RGB: grayscale stays grayscale (16-bit and
/// alpha variants too), the rest becomes RGB.
fn narrow(img: DynamicImage) -> Decoded {
    match img {
        DynamicImage::ImageLuma8(g) => Decoded::Gray(g),
        DynamicImage::ImageRgb8(rgb) => Decoded::Rgb(rgb),
        // 16-bit and alpha variants: grayscale stays grayscale, the rest becomes RGB.
        DynamicImage::ImageLuma16(_)
        | DynamicImage::ImageLumaA8(_)
        | DynamicImage::ImageLumaA16(_) => Decoded::Gray(img.to_luma8()),
        other => Decoded::Rgb(other.to_rgb8()),
    }
}

/// JPEG through `zune-jpeg` itself, with the options and colours `image` gives it (lenient
/// mode; grayscale stays grayscale, every other colour space becomes RGB), so the pixels are
/// those `image` decodes. `image`'s `JpegDecoder` parses the headers and builds the Huffman
/// tables twice per image (once to learn the size, again to decode) and copies the input
/// first; here the headers are parsed once, from the object's bytes in place. For a 28x28
/// image that is most of the decoding.
fn decode_jpeg(bytes: &[u8]) -> Result<Decoded, PreprocessError> {
    use zune_core::{bytestream::ZCursor, colorspace::ColorSpace, options::DecoderOptions};
    let bad = |e: zune_jpeg::errors::DecodeErrors| PreprocessError::Decode {
        format: "JPEG",
        message: e.to_string(),
    };
    // The size is checked below, against MAX_IMAGE_SIDE, as for the other formats.
    let options = DecoderOptions::default()
        .set_strict_mode(false)
        .set_max_width(usize::MAX)
        .set_max_height(usize::MAX);
    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    decoder.decode_headers().map_err(bad)?;
    let (width, height) = decoder
        .dimensions()
        .map_or((0, 0), |(w, h)| (w as u32, h as u32));
    if !(1..=MAX_IMAGE_SIDE).contains(&width) || !(1..=MAX_IMAGE_SIDE).contains(&height) {
        return Err(PreprocessError::BadSize { width, height });
    }
    // zune-jpeg reports no RGBA or LumaA input; the default output, RGB, chose the colour
    // conversion when the headers were parsed, so only grayscale changes the options.
    let gray = decoder.input_colorspace() == Some(ColorSpace::Luma);
    if gray {
        decoder.set_options(options.jpeg_set_out_colorspace(ColorSpace::Luma));
    }
    let size = decoder
        .output_buffer_size()
        .ok_or(PreprocessError::BadSize { width, height })?;
    let mut buf = vec![0u8; size];
    decoder.decode_into(&mut buf).map_err(bad)?;
    let short = || PreprocessError::Decode {
        format: "JPEG",
        message: format!("the decoder gave a short {width}x{height} frame"),
    };
    Ok(if gray {
        Decoded::Gray(GrayImage::from_raw(width, height, buf).ok_or_else(short)?)
    } else {
        Decoded::Rgb(RgbImage::from_raw(width, height, buf).ok_or_else(short)?)
    })
}

/// The CRC of each chunk before the first IDAT (IHDR, PLTE, tRNS, text, ...), as Pillow checks
/// them when it opens a PNG. A file cut short inside them is left to the decoder to report.
fn check_header_crcs(bytes: &[u8]) -> Result<(), PreprocessError> {
    let mut at = 8;
    while let Some(head) = bytes.get(at..at + 8) {
        let (len, kind) = head.split_at(4);
        if kind == b"IDAT" {
            break;
        }
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let Some(end) = (at + 12).checked_add(len).filter(|&e| e <= bytes.len()) else {
            break;
        };
        let stored = &bytes[end - 4..end];
        if crc32fast::hash(&bytes[at + 4..end - 4]).to_be_bytes() != stored {
            return Err(PreprocessError::Decode {
                format: "PNG",
                message: format!(
                    "bad CRC in the {} chunk at byte {at}",
                    String::from_utf8_lossy(kind)
                ),
            });
        }
        at = end;
    }
    Ok(())
}

/// PNG through the `png` crate itself, as `image` decodes it (palettes and bit depths below 8
/// expanded, 16-bit kept and then narrowed by [`narrow`]), with the CRCs checked as Pillow,
/// whose decoding torchvision's pipelines use, checks them: those of the chunks before the
/// image data ([`check_header_crcs`]), not those of the image data (Pillow's `load_read` skips
/// each IDAT chunk's CRC) or after it. zlib's Adler-32 is not checked by `png` by default, so a
/// flipped bit in the image data gives a changed pixel or an inflate error, as in Pillow, not a
/// checksum error. In the Wasm guest the image data's CRC was a tenth of a photo's decoding
/// (table-driven there; natively it uses PCLMULQDQ).
fn decode_png(bytes: &[u8]) -> Result<Decoded, PreprocessError> {
    use image::ImageBuffer;
    use png::{BitDepth::*, ColorType::*};
    let bad = |message: String| PreprocessError::Decode {
        format: "PNG",
        message,
    };
    let err = |e: png::DecodingError| match e {
        png::DecodingError::LimitsExceeded => {
            bad(format!("it needs more than {MAX_DECODE_BYTES} bytes"))
        }
        e => bad(e.to_string()),
    };
    let limits = png::Limits {
        bytes: usize::try_from(MAX_DECODE_BYTES).unwrap_or(usize::MAX),
    };
    check_header_crcs(bytes)?;
    let mut decoder = png::Decoder::new_with_limits(Cursor::new(bytes), limits);
    decoder.ignore_checksums(true);
    decoder.set_ignore_text_chunk(true);
    decoder.set_ignore_iccp_chunk(true);
    let (width, height) = decoder.read_header_info().map_err(err)?.size();
    if !(1..=MAX_IMAGE_SIDE).contains(&width) || !(1..=MAX_IMAGE_SIDE).contains(&height) {
        return Err(PreprocessError::BadSize { width, height });
    }
    decoder.set_transformations(png::Transformations::EXPAND);
    let mut reader = decoder.read_info().map_err(err)?;
    let size = reader.output_buffer_size().ok_or_else(|| {
        bad(format!(
            "a {width}x{height} image overflows this machine's sizes"
        ))
    })?;
    if size as u64 > MAX_DECODE_BYTES {
        return Err(bad(format!(
            "a {width}x{height} image of {size} bytes is over the limit of {MAX_DECODE_BYTES}"
        )));
    }
    // 16-bit samples are read into the buffer of the image they become (big-endian from the
    // decoder, swapped in place), as `image` does: one buffer of `size` bytes either way.
    let sixteen = reader.output_color_type().1 == Sixteen;
    let (mut buf, mut wide) = if sixteen {
        (Vec::new(), vec![0u16; size.div_ceil(2)])
    } else {
        (vec![0u8; size], Vec::new())
    };
    let out = if sixteen {
        bytemuck::cast_slice_mut(&mut wide[..])
    } else {
        &mut buf[..]
    };
    let frame = reader.next_frame(out).map_err(err)?;
    buf.truncate(frame.buffer_size());
    wide.truncate(frame.buffer_size() / 2);
    for v in &mut wide {
        *v = u16::from_be(*v);
    }
    let (w, h) = (width, height);
    let img = match (frame.color_type, frame.bit_depth) {
        (Grayscale, Eight) => ImageBuffer::from_raw(w, h, buf).map(DynamicImage::ImageLuma8),
        (Rgb, Eight) => ImageBuffer::from_raw(w, h, buf).map(DynamicImage::ImageRgb8),
        (GrayscaleAlpha, Eight) => ImageBuffer::from_raw(w, h, buf).map(DynamicImage::ImageLumaA8),
        (Rgba, Eight) => ImageBuffer::from_raw(w, h, buf).map(DynamicImage::ImageRgba8),
        (Grayscale, Sixteen) => ImageBuffer::from_raw(w, h, wide).map(DynamicImage::ImageLuma16),
        (GrayscaleAlpha, Sixteen) => {
            ImageBuffer::from_raw(w, h, wide).map(DynamicImage::ImageLumaA16)
        }
        (Rgb, Sixteen) => ImageBuffer::from_raw(w, h, wide).map(DynamicImage::ImageRgb16),
        (Rgba, Sixteen) => ImageBuffer::from_raw(w, h, wide).map(DynamicImage::ImageRgba16),
        (color, depth) => {
            return Err(bad(format!(
                "{color:?} at {depth:?} bits after expansion is not supported"
            )));
        }
    };
    img.map(narrow)
        .ok_or_else(|| bad(format!("the decoder gave a short {width}x{height} frame")))
}

/// The size torchvision's `Resize(size)` gives a `w` x `h` image: the shorter side becomes
/// `size` and the longer `int(size * long / short)` (truncated, as Python's `int`).
pub fn resized_size(w: u32, h: u32, size: u32) -> (u32, u32) {
    let (short, long) = if w <= h { (w, h) } else { (h, w) };
    // Exact in f64 (both factors < 2^26) and correctly rounded, like Python's int / int.
    let new_long = (f64::from(size) * f64::from(long) / f64::from(short.max(1))) as u32;
    if w <= h {
        (size, new_long)
    } else {
        (new_long, size)
    }
}

/// The offset torchvision's `CenterCrop` takes: `int(round((size - crop) / 2.0))`, with
/// Python's rounding of halves to even.
pub fn crop_offset(size: u32, crop: u32) -> u32 {
    let d = size - crop;
    let half = d / 2;
    if d % 2 == 1 && half % 2 == 1 {
        half + 1
    } else {
        half
    }
}

/// The normalised value of each 8-bit level for each model input channel: `(v / 255 - mean)
/// / std` in f32, in the order torchvision's `ToTensor` and `Normalize` compute it (`(v - mean)
/// / std` with pixels in [0, 255]), each as `store` gives it (the f32 itself, or its bytes).
fn levels<T: Copy>(t: &Transform, store: impl Fn(f32) -> T) -> [[T; 256]; 3] {
    std::array::from_fn(|c| {
        std::array::from_fn(|v| {
            let p = match t.scale {
                Scale::Unit => v as f32 / 255.0,
                Scale::Byte => v as f32,
            };
            store((p - t.mean[c]) / t.std[c])
        })
    })
}

/// Resize (Pillow's resampling with antialiasing), centre crop and normalise an image:
/// torchvision's `Resize`, `CenterCrop(crop)`, `ToTensor()`, `Normalize(mean, std)` on a PIL
/// image, bit for bit. Writes one sample into `dst` (`sample_len` elements) in the transform's
/// layout, each element as `store` gives it; with BGR order, model channel 0 is the image's
/// blue. Every element of `dst` is written ([`write_sample`] asserts its length).
fn transform_with<T: Copy>(
    img: &Decoded,
    t: &Transform,
    store: impl Fn(f32) -> T,
    dst: &mut [T],
) -> Result<(), PreprocessError> {
    t.check()?;
    let (w, h) = img.dimensions();
    let (nw, nh) = match t.resize_mode {
        ResizeMode::Shorter => resized_size(w, h, t.resize),
        ResizeMode::Squash => (t.resize, t.resize),
    };
    let crop = t.crop as usize;
    let win = resize::Window {
        left: crop_offset(nw, t.crop) as usize,
        top: crop_offset(nh, t.crop) as usize,
        width: crop,
        height: crop,
    };
    let (src, out) = ((w as usize, h as usize), (nw as usize, nh as usize));
    let lut = levels(t, store);
    // The image channel each model channel reads.
    let sources = match t.channel_order {
        ChannelOrder::Rgb => [0, 1, 2],
        ChannelOrder::Bgr => [2, 1, 0],
    };
    match img {
        Decoded::Gray(g) => {
            let px = resize::resize_window::<1>(g.as_raw(), src, out, win, t.filter);
            write_sample::<1, T>(&px, &lut, [0; 3], t.layout, dst);
        }
        Decoded::Rgb(rgb) => {
            let px = resize::resize_window::<3>(rgb.as_raw(), src, out, win, t.filter);
            write_sample::<3, T>(&px, &lut, sources, t.layout, dst);
        }
    }
    Ok(())
}

/// Normalised elements of the interleaved `C`-channel pixels `px` into `dst` (3 per pixel):
/// model channel `c` is image channel `sources[c]` through `lut[c]`. Channel planes one after
/// the other (NCHW) or the three channels of each pixel together (NHWC). Writes every element
/// of `dst` once, which the assert makes so: exactly three planes, or `pixels` triples, each as
/// long as the pixels it zips with ([`append_sample`] relies on it).
fn write_sample<const C: usize, T: Copy>(
    px: &[u8],
    lut: &[[T; 256]; 3],
    sources: [usize; 3],
    layout: Layout,
    dst: &mut [T],
) {
    let pixels = px.len() / C;
    assert!(
        pixels > 0 && px.len() == C * pixels && dst.len() == 3 * pixels,
        "one sample is 3 x {pixels} elements"
    );
    match layout {
        Layout::Nchw => {
            for ((plane, lut), &source) in dst.chunks_exact_mut(pixels).zip(lut).zip(&sources) {
                for (d, p) in plane.iter_mut().zip(px.chunks_exact(C)) {
                    *d = lut[usize::from(p[source])];
                }
            }
        }
        Layout::Nhwc => {
            for (d, p) in dst.chunks_exact_mut(3).zip(px.chunks_exact(C)) {
                for c in 0..3 {
                    d[c] = lut[c][usize::from(p[sources[c]])];
                }
            }
        }
    }
}

/// Appends one sample of `img` to `out`, `K` items an element as `store` gives them, written
/// into `out`'s spare capacity: no zeroing first.
fn append_sample<E: Copy, const K: usize>(
    img: &Decoded,
    t: &Transform,
    store: impl Fn(f32) -> [E; K],
    out: &mut Vec<E>,
) -> Result<(), PreprocessError> {
    t.check()?;
    let n = K * t.sample_len();
    out.reserve(n);
    let (dst, rest) = out.spare_capacity_mut()[..n].as_chunks_mut::<K>();
    debug_assert!(rest.is_empty());
    transform_with(img, t, |v| store(v).map(MaybeUninit::new), dst)?;
    // SAFETY: `transform_with` returned, so `write_sample` wrote every element of `dst`, the
    // `n` items past the length, for which `reserve` made room.
    unsafe { out.set_len(out.len() + n) };
    Ok(())
}

/// Resize, centre crop and normalise an image into f32 in the transform's layout, appended
/// to `out`.
pub fn transform_into(
    img: &Decoded,
    t: &Transform,
    out: &mut Vec<f32>,
) -> Result<(), PreprocessError> {
    append_sample(img, t, |v| [v], out)
}

/// [`transform_into`] as little-endian f32 bytes appended to `out`: the layout of an FP32 tensor
/// handed to wasi-nn, written in place (no f32 copy, no zeroing first).
pub fn transform_into_le_bytes(
    img: &Decoded,
    t: &Transform,
    out: &mut Vec<u8>,
) -> Result<(), PreprocessError> {
    append_sample(img, t, f32::to_le_bytes, out)
}

/// Decode and transform one encoded image into f32 in the transform's layout.
pub fn preprocess(bytes: &[u8], t: &Transform) -> Result<Vec<f32>, PreprocessError> {
    let img = decode(bytes)?;
    let mut out = Vec::with_capacity(t.sample_len());
    transform_into(&img, t, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Transform = Transform::new(8, 4, [0.5, 0.5, 0.5], [0.25, 0.25, 0.25]);

    fn png(img: &DynamicImage) -> Vec<u8> {
        let mut buf = Cursor::new(Vec::new());
        img.write_to(&mut buf, ImageFormat::Png).expect("encode");
        buf.into_inner()
    }

    fn photo() -> Decoded {
        Decoded::Rgb(RgbImage::from_fn(23, 15, |x, y| {
            image::Rgb([(x * 11) as u8, (y * 17) as u8, ((x + y) * 5) as u8])
        }))
    }

    #[test]
    fn bgr_order_is_rgb_with_channels_and_statistics_reversed() {
        let rgb = Transform::new(8, 6, [0.1, 0.2, 0.3], [0.5, 0.6, 0.7]);
        let bgr = Transform {
            channel_order: ChannelOrder::Bgr,
            mean: [0.3, 0.2, 0.1],
            std: [0.7, 0.6, 0.5],
            ..rgb
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        transform_into(&photo(), &rgb, &mut a).expect("rgb");
        transform_into(&photo(), &bgr, &mut b).expect("bgr");
        let plane = 36;
        for c in 0..3 {
            assert_eq!(
                a[c * plane..][..plane],
                b[(2 - c) * plane..][..plane],
                "channel {c}"
            );
        }
    }

    #[test]
    fn nhwc_is_nchw_transposed() {
        let nchw = Transform::new(8, 6, [0.1, 0.2, 0.3], [0.5, 0.6, 0.7]);
        let nhwc = Transform {
            layout: Layout::Nhwc,
            ..nchw
        };
        assert_eq!(nhwc.sample_shape(), [6, 6, 3]);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        transform_into(&photo(), &nchw, &mut a).expect("nchw");
        transform_into(&photo(), &nhwc, &mut b).expect("nhwc");
        for c in 0..3 {
            for i in 0..36 {
                assert_eq!(a[c * 36 + i], b[i * 3 + c]);
            }
        }
        let mut bytes = Vec::new();
        transform_into_le_bytes(&photo(), &nhwc, &mut bytes).expect("bytes");
        let back: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(back, b);
    }

    #[test]
    fn byte_scale_normalises_levels_not_fractions() {
        let img = Decoded::Gray(GrayImage::from_pixel(9, 9, image::Luma([200])));
        let t = Transform {
            scale: Scale::Byte,
            ..Transform::new(9, 9, [100.0, 120.0, 150.0], [2.0, 4.0, 5.0])
        };
        let mut out = Vec::new();
        transform_into(&img, &t, &mut out).expect("ok");
        assert_eq!([out[0], out[81], out[162]], [50.0, 20.0, 10.0]);
    }

    #[test]
    fn squash_ignores_the_aspect_ratio_and_equals_shorter_on_a_square() {
        let t = Transform {
            resize_mode: ResizeMode::Squash,
            ..Transform::new(6, 6, [0.0; 3], [1.0; 3])
        };
        let mut out = Vec::new();
        // 23x15 squashed to 6x6: every output pixel has data (no crop of the long side).
        transform_into(&photo(), &t, &mut out).expect("squash");
        assert_eq!(out.len(), 3 * 36);
        let square = Decoded::Rgb(RgbImage::from_fn(15, 15, |x, y| {
            image::Rgb([(x * 11) as u8, (y * 17) as u8, 3])
        }));
        let shorter = Transform::new(6, 6, [0.0; 3], [1.0; 3]);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        transform_into(&square, &t, &mut a).expect("squash");
        transform_into(&square, &shorter, &mut b).expect("shorter");
        assert_eq!(a, b);
        // The long side is squeezed, not cropped: the last column holds the image's right edge.
        let mut wide = Vec::new();
        let stripe = Decoded::Gray(GrayImage::from_fn(40, 10, |x, _| {
            image::Luma([if x >= 36 { 255 } else { 0 }])
        }));
        transform_into(&stripe, &t, &mut wide).expect("squash");
        assert!(wide[5] > 0.5, "right edge kept: {:?}", &wide[..6]);
        let mut cropped = Vec::new();
        transform_into(&stripe, &shorter, &mut cropped).expect("shorter");
        assert_eq!(cropped[5], 0.0, "the shorter-side crop cuts it off");
    }

    #[test]
    fn names_parse_and_print_round_trip() {
        for m in [ResizeMode::Shorter, ResizeMode::Squash] {
            assert_eq!(m.name().parse::<ResizeMode>(), Ok(m));
        }
        for f in [Filter::Bilinear, Filter::Bicubic] {
            assert_eq!(f.name().parse::<Filter>(), Ok(f));
        }
        assert!("bgra".parse::<ChannelOrder>().is_err());
        assert_eq!(Scale::from_max(255.0), Ok(Scale::Byte));
        assert!(Scale::from_max(2.0).is_err());
    }

    #[test]
    fn webp_decodes_to_the_pixels_a_png_of_the_same_image_gives() {
        let rgb = RgbImage::from_fn(13, 9, |x, y| {
            image::Rgb([(x * 19) as u8, (y * 27) as u8, 99])
        });
        let img = DynamicImage::ImageRgb8(rgb);
        let mut webp = Cursor::new(Vec::new());
        img.write_to(&mut webp, ImageFormat::WebP)
            .expect("lossless WebP");
        let webp = webp.into_inner();
        assert_eq!(image::guess_format(&webp).ok(), Some(ImageFormat::WebP));
        assert_eq!(preprocess(&webp, &T), preprocess(&png(&img), &T));
        let e = preprocess(&webp[..webp.len() / 2], &T).expect_err("truncated");
        assert!(e.to_string().contains("WebP"), "{e}");
    }

    #[test]
    fn grayscale_becomes_three_equal_channels() {
        let gray = GrayImage::from_fn(10, 6, |x, y| image::Luma([(x * 20 + y) as u8]));
        let out = preprocess(&png(&DynamicImage::ImageLuma8(gray)), &T).expect("ok");
        assert_eq!(out.len(), T.sample_len());
        let plane = 16;
        assert_eq!(out[..plane], out[plane..2 * plane]);
        assert_eq!(out[..plane], out[2 * plane..]);
    }

    #[test]
    fn grayscale_resized_as_one_channel_equals_grayscale_resized_as_rgb() {
        let gray = GrayImage::from_fn(28, 28, |x, y| image::Luma([(x * 9 + y * 3) as u8]));
        let as_rgb = DynamicImage::ImageLuma8(gray.clone()).to_rgb8();
        let t = Transform {
            resize: 256,
            crop: 224,
            ..T
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        transform_into(&Decoded::Gray(gray), &t, &mut a).expect("gray");
        transform_into(&Decoded::Rgb(as_rgb), &t, &mut b).expect("rgb");
        assert_eq!(a, b);
    }

    #[test]
    fn uniform_image_normalises_to_the_expected_value() {
        let img = RgbImage::from_pixel(20, 30, image::Rgb([255, 0, 128]));
        let out = preprocess(&png(&DynamicImage::ImageRgb8(img)), &T).expect("ok");
        assert!(out[..16].iter().all(|v| (v - 2.0).abs() < 1e-6)); // (1 - .5) / .25
        assert!(out[16..32].iter().all(|v| (v + 2.0).abs() < 1e-6)); // (0 - .5) / .25
        let mid = (128.0 / 255.0 - 0.5) / 0.25;
        assert!(out[32..].iter().all(|v| (v - mid).abs() < 1e-6));
    }

    #[test]
    fn garbage_and_truncated_images_are_errors() {
        assert_eq!(decode(b"hello"), Err(PreprocessError::UnknownFormat));
        let img = RgbImage::from_pixel(20, 30, image::Rgb([1, 2, 3]));
        let bytes = png(&DynamicImage::ImageRgb8(img));
        let err = decode(&bytes[..bytes.len() / 2]).expect_err("truncated");
        assert!(
            matches!(err, PreprocessError::Decode { format: "PNG", .. }),
            "{err}"
        );
    }

    /// A PNG written by the `png` crate itself: palettes and bit depths below 8.
    fn raw_png(
        w: u32,
        h: u32,
        color: png::ColorType,
        depth: png::BitDepth,
        data: &[u8],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(color);
        enc.set_depth(depth);
        // A transparent colour (or palette alpha): expanded to an alpha channel, then dropped.
        match (color, depth) {
            (png::ColorType::Indexed, _) => {
                enc.set_palette(
                    (0..=255u8)
                        .flat_map(|i| [i, 255 - i, i / 2])
                        .collect::<Vec<_>>(),
                );
                enc.set_trns(vec![255u8, 128, 0]);
            }
            (png::ColorType::Grayscale, png::BitDepth::Eight) => enc.set_trns(vec![0u8, 73]),
            (png::ColorType::Rgb, png::BitDepth::Sixteen) => {
                enc.set_trns(vec![0u8, 73, 0, 146, 0, 219])
            }
            _ => {}
        }
        let mut w = enc.write_header().expect("header");
        w.write_image_data(data).expect("data");
        w.finish().expect("finish");
        out
    }

    #[test]
    fn png_decodes_as_the_image_crate_does_for_every_pixel_type() {
        let (w, h) = (13u32, 7u32);
        let v = |x: u32, y: u32, c: u32| ((x * 37 + y * 91 + c * 53) % 256) as u8;
        let w16 = |x: u32, y: u32, c: u32| (x * 4099 + y * 731 + c * 9001) as u16;
        let images = [
            DynamicImage::ImageLuma8(GrayImage::from_fn(w, h, |x, y| image::Luma([v(x, y, 0)]))),
            DynamicImage::ImageLumaA8(image::ImageBuffer::from_fn(w, h, |x, y| {
                image::LumaA([v(x, y, 0), v(x, y, 1)])
            })),
            DynamicImage::ImageRgb8(RgbImage::from_fn(w, h, |x, y| {
                image::Rgb([v(x, y, 0), v(x, y, 1), v(x, y, 2)])
            })),
            DynamicImage::ImageRgba8(image::ImageBuffer::from_fn(w, h, |x, y| {
                image::Rgba([v(x, y, 0), v(x, y, 1), v(x, y, 2), v(x, y, 3)])
            })),
            DynamicImage::ImageLuma16(image::ImageBuffer::from_fn(w, h, |x, y| {
                image::Luma([w16(x, y, 0)])
            })),
            DynamicImage::ImageLumaA16(image::ImageBuffer::from_fn(w, h, |x, y| {
                image::LumaA([w16(x, y, 0), w16(x, y, 1)])
            })),
            DynamicImage::ImageRgb16(image::ImageBuffer::from_fn(w, h, |x, y| {
                image::Rgb([w16(x, y, 0), w16(x, y, 1), w16(x, y, 2)])
            })),
            DynamicImage::ImageRgba16(image::ImageBuffer::from_fn(w, h, |x, y| {
                image::Rgba([w16(x, y, 0), w16(x, y, 1), w16(x, y, 2), w16(x, y, 3)])
            })),
        ];
        let mut files: Vec<(String, Vec<u8>)> = images
            .iter()
            .map(|i| (format!("{:?}", i.color()), png(i)))
            .collect();
        let packed = |bits: u32| -> Vec<u8> {
            let row = (w * bits).div_ceil(8) as usize;
            (0..row * h as usize)
                .map(|i| (i * 73 % 256) as u8)
                .collect()
        };
        use png::{BitDepth as D, ColorType as C};
        for (color, depth, bits) in [
            (C::Indexed, D::Eight, 8),
            (C::Indexed, D::Two, 2),
            (C::Grayscale, D::One, 1),
            (C::Grayscale, D::Four, 4),
            (C::Grayscale, D::Eight, 8),
            (C::Rgb, D::Sixteen, 48),
        ] {
            let name = format!("{color:?} {depth:?}");
            files.push((name, raw_png(w, h, color, depth, &packed(bits))));
        }
        for (name, bytes) in &files {
            let ours = decode(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            let theirs = image::load_from_memory_with_format(bytes, ImageFormat::Png)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(ours, narrow(theirs), "{name}");
            assert_eq!(ours.dimensions(), (w, h), "{name}");
        }
    }

    #[test]
    fn png_crcs_are_checked_as_pillow_checks_them() {
        let img = RgbImage::from_fn(20, 30, |x, y| image::Rgb([x as u8, y as u8, 7]));
        let good = png(&DynamicImage::ImageRgb8(img.clone()));
        // Chunks are length, type, data, CRC: (type, offset of its CRC) of each.
        let mut chunks = Vec::new();
        let mut at = 8;
        while at + 12 <= good.len() {
            let len = u32::from_be_bytes(good[at..at + 4].try_into().expect("4")) as usize;
            chunks.push((good[at + 4..at + 8].to_vec(), at + 8 + len));
            at += 12 + len;
        }
        assert_eq!(at, good.len(), "walked every chunk");
        let flipped = |kinds: &[&[u8]]| {
            let mut bytes = good.clone();
            for (kind, crc) in &chunks {
                if kinds.contains(&kind.as_slice()) {
                    bytes[*crc] ^= 0xff;
                }
            }
            bytes
        };
        // The image data's CRCs and IEND's (Pillow skips them): the image, where `image` fails.
        let data = flipped(&[b"IDAT", b"IEND"]);
        assert!(
            image::load_from_memory(&data).is_err(),
            "image checks every CRC"
        );
        assert_eq!(decode(&data), Ok(Decoded::Rgb(img.clone())));
        // A text chunk with a bad CRC: before the image data an error (Pillow checks every
        // chunk's CRC until IDAT), after it the image (neither reads it).
        let chunk_start = |kind: &[u8]| -> usize {
            let mut at = 8;
            loop {
                let len = u32::from_be_bytes(good[at..at + 4].try_into().expect("4")) as usize;
                if &good[at + 4..at + 8] == kind {
                    return at;
                }
                at += 12 + len;
            }
        };
        let with_text = |at: usize| {
            let data = b"tEXtComment\0written by a test";
            let mut chunk = ((data.len() - 4) as u32).to_be_bytes().to_vec();
            chunk.extend_from_slice(data);
            chunk.extend_from_slice(&(crc32fast::hash(data) ^ 1).to_be_bytes());
            let mut bytes = good.clone();
            bytes.splice(at..at, chunk);
            bytes
        };
        let err = decode(&with_text(chunk_start(b"IDAT"))).expect_err("bad tEXt CRC before IDAT");
        assert!(
            err.to_string()
                .contains("bad CRC in the tEXt chunk at byte 33"),
            "{err}"
        );
        assert_eq!(
            decode(&with_text(chunk_start(b"IEND"))),
            Ok(Decoded::Rgb(img.clone()))
        );
        // The header's (Pillow: "broken PNG file (bad header checksum in b'IHDR')").
        let err = decode(&flipped(&[b"IHDR"])).expect_err("bad IHDR CRC");
        assert_eq!(
            err,
            PreprocessError::Decode {
                format: "PNG",
                message: "bad CRC in the IHDR chunk at byte 8".into()
            }
        );
    }

    #[test]
    fn oversized_image_is_refused() {
        let wide = RgbImage::new(MAX_IMAGE_SIDE + 1, 1);
        let err = decode(&png(&DynamicImage::ImageRgb8(wide))).expect_err("too wide");
        assert_eq!(
            err,
            PreprocessError::BadSize {
                width: MAX_IMAGE_SIDE + 1,
                height: 1
            }
        );
        // Within the sides but over the decoder's allocation limit (16-bit RGBA: 8 bytes a
        // pixel): refused from the header, before its buffer is allocated.
        let side = MAX_IMAGE_SIDE as usize;
        let header = raw_png(1, 1, png::ColorType::Rgba, png::BitDepth::Sixteen, &[0; 8]);
        let mut big = header.clone();
        big[16..24].copy_from_slice(
            &[
                &(side as u32).to_be_bytes()[..],
                &(side as u32).to_be_bytes()[..],
            ]
            .concat(),
        );
        let crc = crc32fast::hash(&big[12..29]).to_be_bytes();
        big[29..33].copy_from_slice(&crc);
        let err = decode(&big).expect_err("too many bytes");
        assert!(
            matches!(&err, PreprocessError::Decode { format: "PNG", message } if message.contains("over the limit")),
            "{err}"
        );
    }

    #[test]
    fn a_transform_from_lists_needs_three_values_each() {
        let t = Transform::from_lists(8, 4, &[0.5; 3], &[0.25; 3]).expect("three each");
        assert_eq!(t, T);
        let err = Transform::from_lists(8, 4, &[0.5; 2], &[0.25; 3]).expect_err("two means");
        assert_eq!(
            err,
            PreprocessError::BadTransform("mean has 2 values, expected 3".into())
        );
        assert!(Transform::from_lists(8, 4, &[0.5; 3], &[]).is_err());
    }

    #[test]
    fn bad_transform_is_an_error() {
        let img = Decoded::Rgb(RgbImage::new(4, 4));
        let mut out = Vec::new();
        let bad = Transform { crop: 9, ..T };
        assert!(matches!(
            transform_into(&img, &bad, &mut out),
            Err(PreprocessError::BadTransform(_))
        ));
    }
}
