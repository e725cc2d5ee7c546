//! [ImageDecoder](https://onnx.ai/onnx/operators/onnx__ImageDecoder.html), opset 20+: decodes
//! an encoded image (a 1-D uint8 tensor) to `[H, W, 3]` (RGB or BGR) or `[H, W, 1]`
//! (grayscale) uint8, with the pure-Rust `image` crate: PNG, JPEG, BMP, WebP, TIFF and PNM
//! (no JPEG 2000). Grayscale uses ITU-R 601-2 luma with the same fixed-point rounding as
//! Pillow, ONNX's reference; JPEG decoders may differ from libjpeg by a unit or two.

use super::rank_only;
use crate::error::{OpError, Result};
use crate::util::checked_numel;
use crate::value::{Args, InferInput, ValueType};
use kiln_tensor::{DType, Tensor};

/// Channel layout of ImageDecoder's output.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum PixelFormat {
    Rgb,
    Bgr,
    Grayscale,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ImageDecoder {
    pub pixel_format: PixelFormat,
}

/// Pillow's RGB → L conversion: `(R·19595 + G·38470 + B·7471 + 2^15) >> 16`.
fn luma(r: u8, g: u8, b: u8) -> u8 {
    ((r as u32 * 19595 + g as u32 * 38470 + b as u32 * 7471 + 0x8000) >> 16) as u8
}

impl ImageDecoder {
    pub fn name(&self) -> &'static str {
        "ImageDecoder"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let bytes = x.as_slice::<u8>().map_err(|_| OpError::UnsupportedDType {
            index: 0,
            got: x.dtype(),
        })?;
        let img = image::load_from_memory(bytes)
            .map_err(|e| OpError::input_value(0, "an encoded image", format!("bytes that do not decode ({e})")))?;
        let (w, h) = (img.width() as usize, img.height() as usize);
        let channels = if self.pixel_format == PixelFormat::Grayscale {
            1
        } else {
            3
        };
        let shape = vec![h, w, channels];
        checked_numel(&shape)?;
        let data = match self.pixel_format {
            PixelFormat::Grayscale if !img.color().has_color() => img.to_luma8().into_raw(),
            PixelFormat::Grayscale => img.to_rgb8().pixels().map(|p| luma(p[0], p[1], p[2])).collect(),
            PixelFormat::Rgb => img.to_rgb8().into_raw(),
            PixelFormat::Bgr => img.to_rgb8().pixels().flat_map(|p| [p[2], p[1], p[0]]).collect(),
        };
        Ok(smallvec::smallvec![Tensor::from_vec(shape, data)?.into()])
    }
    pub fn infer(&self, _inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let mut t = rank_only(Some(DType::U8), 3);
        if let ValueType::Tensor(tt) = &mut t
            && let Some(s) = tt.shape.as_mut()
        {
            s[2] = crate::value::Dim::Fixed(if self.pixel_format == PixelFormat::Grayscale {
                1
            } else {
                3
            });
        }
        Ok(vec![t])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    #[test]
    fn pillow_luma() {
        assert_eq!(luma(255, 255, 255), 255);
        assert_eq!(luma(255, 0, 0), 76); // 0.299 · 255 = 76.2
        assert_eq!(luma(0, 255, 0), 150); // 0.587 · 255 = 149.7
        assert_eq!(luma(0, 0, 255), 29); // 0.114 · 255 = 29.1
    }

    #[test]
    fn decodes_a_bmp() {
        // 1×1 24-bit BMP holding the pixel (B, G, R) = (1, 2, 3).
        let mut bmp = vec![b'B', b'M'];
        bmp.extend(58u32.to_le_bytes());
        bmp.extend([0; 4]);
        bmp.extend(54u32.to_le_bytes());
        bmp.extend(40u32.to_le_bytes());
        bmp.extend(1i32.to_le_bytes());
        bmp.extend(1i32.to_le_bytes());
        bmp.extend(1u16.to_le_bytes());
        bmp.extend(24u16.to_le_bytes());
        bmp.extend([0; 24]);
        bmp.extend([1, 2, 3, 0]);
        let x = Value::Tensor(Tensor::from_vec(vec![bmp.len()], bmp).unwrap());
        let op = ImageDecoder {
            pixel_format: PixelFormat::Bgr,
        };
        let y = op.eval(&Args::new(&[Some(&x)])).unwrap();
        let t = y[0].as_tensor().unwrap();
        assert_eq!(t.shape(), &[1, 1, 3]);
        assert_eq!(t.as_slice::<u8>().unwrap(), &[1, 2, 3]);
    }
}
