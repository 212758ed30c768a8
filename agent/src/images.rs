//! Images shrunk before they are sent: a provider scales anything larger down to about
//! [`MAX_EDGE`] pixels on its longest edge anyway, so sending more only fills the request.
//!
//! A photo (JPEG, or any image without transparency) is re-encoded as JPEG; an image with
//! transparent pixels stays PNG. The result is never larger than the original: when it would
//! be, the original is sent. Pure functions of bytes.

use std::io::Cursor;

use image::{DynamicImage, GenericImageView, ImageFormat, ImageReader, Limits};

/// Longest edge, in pixels, of an image as it is sent.
pub const MAX_EDGE: u32 = 1568;
/// Largest width or height accepted at all.
pub const MAX_DIMENSION: u32 = 12_000;
/// Decoder memory bound (a 12,000 × 12,000 RGBA image is 576 MB: far more than this).
pub const MAX_DECODE_BYTES: u64 = 256 * 1024 * 1024;
/// JPEG quality of re-encoded photos.
pub const JPEG_QUALITY: u8 = 85;

/// Why an image was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    #[error("the image is not a PNG or JPEG file this session can read: {0}")]
    Unreadable(String),
    #[error(
        "the image is {width}x{height} pixels; at most {MAX_DIMENSION} on each side are accepted"
    )]
    TooLarge { width: u32, height: u32 },
    #[error("the image data is {declared}, but the data URL says {claimed}")]
    Mismatch {
        declared: &'static str,
        claimed: String,
    },
}

/// An image as it will be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub media_type: &'static str,
    pub bytes: Vec<u8>,
    pub width: u32,
    pub height: u32,
    /// The original's size, when the image was shrunk (otherwise `bytes` is the original).
    pub original: Option<(u32, u32)>,
}

fn media_type(f: ImageFormat) -> &'static str {
    match f {
        ImageFormat::Png => "image/png",
        _ => "image/jpeg",
    }
}

/// The image to send for `bytes` (declared as `claimed`, e.g. `image/png`).
pub fn prepare(bytes: &[u8], claimed: &str) -> Result<Prepared, ImageError> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::Unreadable(e.to_string()))?;
    let format = match reader.format() {
        Some(f @ (ImageFormat::Png | ImageFormat::Jpeg)) => f,
        Some(f) => {
            return Err(ImageError::Unreadable(format!(
                "{f:?} images are not accepted"
            )));
        }
        None => return Err(ImageError::Unreadable("unknown format".into())),
    };
    if media_type(format) != claimed {
        return Err(ImageError::Mismatch {
            declared: media_type(format),
            claimed: claimed.to_owned(),
        });
    }
    let (width, height) = reader
        .into_dimensions()
        .map_err(|e| ImageError::Unreadable(e.to_string()))?;
    if width > MAX_DIMENSION || height > MAX_DIMENSION || width == 0 || height == 0 {
        return Err(ImageError::TooLarge { width, height });
    }
    let unchanged = Prepared {
        media_type: media_type(format),
        bytes: bytes.to_vec(),
        width,
        height,
        original: None,
    };
    if width.max(height) <= MAX_EDGE {
        // Decoded all the same: a file that only starts like an image is refused here.
        decode(bytes, format)?;
        return Ok(unchanged);
    }
    let img = decode(bytes, format)?;
    let (w, h) = fit(width, height);
    let small = img.thumbnail_exact(w, h);
    let transparent = small.color().has_alpha() && has_transparency(&small);
    let (out_format, encoded) = if transparent {
        (ImageFormat::Png, encode_png(&small)?)
    } else {
        (ImageFormat::Jpeg, encode_jpeg(&small)?)
    };
    if encoded.len() >= bytes.len() {
        return Ok(unchanged);
    }
    Ok(Prepared {
        media_type: media_type(out_format),
        bytes: encoded,
        width: w,
        height: h,
        original: Some((width, height)),
    })
}

fn decode(bytes: &[u8], format: ImageFormat) -> Result<DynamicImage, ImageError> {
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_DIMENSION);
    limits.max_image_height = Some(MAX_DIMENSION);
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    reader.limits(limits);
    reader
        .decode()
        .map_err(|e| ImageError::Unreadable(e.to_string()))
}

/// The size that fits `MAX_EDGE` on the longest edge, keeping the aspect ratio.
pub fn fit(width: u32, height: u32) -> (u32, u32) {
    let long = width.max(height);
    if long <= MAX_EDGE {
        return (width, height);
    }
    let scale = |x: u32| {
        ((u64::from(x) * u64::from(MAX_EDGE) + u64::from(long) / 2) / u64::from(long)).max(1) as u32
    };
    (scale(width), scale(height))
}

fn has_transparency(img: &DynamicImage) -> bool {
    img.pixels().any(|(_, _, p)| p.0[3] < 255)
}

fn encode_png(img: &DynamicImage) -> Result<Vec<u8>, ImageError> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, ImageFormat::Png)
        .map_err(|e| ImageError::Unreadable(e.to_string()))?;
    Ok(out.into_inner())
}

fn encode_jpeg(img: &DynamicImage) -> Result<Vec<u8>, ImageError> {
    let rgb = DynamicImage::ImageRgb8(img.to_rgb8());
    let mut out = Vec::new();
    let encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, JPEG_QUALITY);
    rgb.write_with_encoder(encoder)
        .map_err(|e| ImageError::Unreadable(e.to_string()))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{Rgb, RgbImage, Rgba, RgbaImage};

    #[test]
    fn fitting_keeps_the_aspect_ratio() {
        assert_eq!(fit(4000, 3000), (1568, 1176));
        assert_eq!(fit(1000, 3136), (500, 1568));
        assert_eq!(fit(800, 600), (800, 600));
    }

    #[test]
    fn small_images_pass_unchanged_and_garbage_is_refused() {
        let img = DynamicImage::ImageRgb8(RgbImage::from_pixel(20, 10, Rgb([1, 2, 3])));
        let png = encode_png(&img).unwrap();
        let p = prepare(&png, "image/png").unwrap();
        assert_eq!(p.bytes, png);
        assert_eq!(p.original, None);
        assert!(prepare(b"not an image", "image/png").is_err());
        assert!(matches!(
            prepare(&png, "image/jpeg"),
            Err(ImageError::Mismatch { .. })
        ));
        let mut cut = png.clone();
        cut.truncate(png.len() / 2);
        assert!(prepare(&cut, "image/png").is_err());
    }

    #[test]
    fn a_large_transparent_png_stays_png_and_shrinks() {
        let img = RgbaImage::from_fn(2000, 1600, |x, y| {
            Rgba([
                (x % 256) as u8,
                (y % 256) as u8,
                ((x ^ y) % 256) as u8,
                if x < 1000 { 0 } else { 255 },
            ])
        });
        let png = encode_png(&DynamicImage::ImageRgba8(img)).unwrap();
        let p = prepare(&png, "image/png").unwrap();
        assert_eq!(p.media_type, "image/png");
        assert_eq!((p.width, p.height), (1568, 1254));
        assert!(p.bytes.len() < png.len());
    }
}
