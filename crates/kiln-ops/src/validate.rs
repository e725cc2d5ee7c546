//! One check of an op's attributes, made where an op enters kiln: by the importer after it
//! builds the op from ONNX attributes, and by the program decoder for every step of a `.kiln`
//! file (whose bytes may have been crafted past their checksums). Evaluation can then rely on
//! what is checked here; it still bounds sizes that depend on tensor values.
//!
//! The rules are the ONNX specs' constraints on attributes alone (no input shapes): windows
//! and strides of at least 1, groups of at least 1, gram lengths in order. Ops with no rule
//! beyond their types pass.

use crate::Op;
use crate::error::{OpError, Result};
use crate::misc::MiscOp;
use crate::nn::{Conv, ConvTranspose, DeformConv, NnOp, Pool, PoolKind};

impl Op {
    /// Checks the attributes against the op's spec (see the module docs).
    pub fn validate(&self) -> Result<()> {
        match self {
            Op::Nn(NnOp::Conv(c)) => conv(c),
            Op::Nn(NnOp::ConvTranspose(c)) => conv_transpose(c),
            Op::Nn(NnOp::DeformConv(c)) => deform_conv(c),
            Op::Nn(NnOp::Pool(p)) => pool(p),
            Op::Nn(NnOp::PointwiseDepthwise(f)) => {
                conv(&f.pointwise.conv)?;
                conv(&f.depthwise.conv)
            }
            Op::Misc(MiscOp::TfIdfVectorizer(t)) => {
                if t.min_gram_length < 1 || t.min_gram_length > t.max_gram_length {
                    return Err(invalid(
                        "min_gram_length",
                        "1 ..= max_gram_length",
                        format!("{} (max_gram_length {})", t.min_gram_length, t.max_gram_length),
                    ));
                }
                if let Some(c) = t.ngram_counts.iter().find(|&&c| c < 0) {
                    return Err(invalid("ngram_counts", "values >= 0", c.to_string()));
                }
                if let Some(i) = t.ngram_indexes.iter().find(|&&i| i < 0) {
                    return Err(invalid("ngram_indexes", "values >= 0", i.to_string()));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

fn invalid(attr: &'static str, expected: &'static str, got: String) -> OpError {
    OpError::attribute(attr, expected, got)
}

/// Every value at least 1 (strides, dilations, a window's extent).
fn positive(attr: &'static str, v: &[usize]) -> Result<()> {
    match v.iter().find(|&&d| d == 0) {
        Some(_) => Err(invalid(attr, "every value >= 1", format!("{v:?}"))),
        None => Ok(()),
    }
}

fn even_pads(pads: &[usize]) -> Result<()> {
    if pads.len() % 2 != 0 {
        return Err(invalid(
            "pads",
            "a begin and an end per axis",
            format!("{} values", pads.len()),
        ));
    }
    Ok(())
}

fn group_at_least_one(attr: &'static str, g: usize) -> Result<()> {
    if g == 0 {
        return Err(invalid(attr, ">= 1", "0".into()));
    }
    Ok(())
}

/// The attributes every convolution shares: a group, strides, dilations, a window, pads.
fn window(group: usize, strides: &[usize], dilations: &[usize], kernel: &[usize], pads: &[usize]) -> Result<()> {
    group_at_least_one("group", group)?;
    positive("strides", strides)?;
    positive("dilations", dilations)?;
    positive("kernel_shape", kernel)?;
    even_pads(pads)
}

fn conv(c: &Conv) -> Result<()> {
    window(c.group, &c.strides, &c.dilations, &c.kernel_shape, &c.pads)
}

fn conv_transpose(c: &ConvTranspose) -> Result<()> {
    window(c.group, &c.strides, &c.dilations, &c.kernel_shape, &c.pads)
}

fn deform_conv(c: &DeformConv) -> Result<()> {
    group_at_least_one("offset_group", c.offset_group)?;
    window(c.group, &c.strides, &c.dilations, &c.kernel_shape, &c.pads)
}

fn pool(p: &Pool) -> Result<()> {
    if p.kernel_shape.is_empty() {
        return Err(invalid(
            "kernel_shape",
            "a window (the attribute is required)",
            "none".into(),
        ));
    }
    positive("kernel_shape", &p.kernel_shape)?;
    positive("strides", &p.strides)?;
    positive("dilations", &p.dilations)?;
    even_pads(&p.pads)?;
    if let PoolKind::Lp { p } = p.kind
        && !(p.is_finite() && p > 0.0)
    {
        return Err(invalid("p", "a positive number", p.to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::AutoPad;

    fn max_pool(kernel: Vec<usize>, strides: Vec<usize>) -> Op {
        Op::Nn(NnOp::Pool(Pool {
            kind: PoolKind::Max { storage_order: false },
            auto_pad: AutoPad::NotSet,
            ceil_mode: false,
            dilations: vec![],
            kernel_shape: kernel,
            pads: vec![],
            strides,
        }))
    }

    #[test]
    fn attributes_outside_the_spec_are_refused_by_name() {
        let ok = Op::Nn(NnOp::Conv(Conv {
            group: 1,
            strides: vec![2, 2],
            ..Default::default()
        }));
        assert!(ok.validate().is_ok());
        let zero_group = Op::Nn(NnOp::Conv(Conv::default()));
        let e = zero_group.validate().unwrap_err();
        assert!(
            matches!(&e, OpError::Attribute { attr: "group", got, .. } if got == "0"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "attribute group: expected >= 1, got 0");
        let zero_stride = Op::Nn(NnOp::Conv(Conv {
            group: 1,
            strides: vec![1, 0],
            ..Default::default()
        }));
        assert!(zero_stride.validate().unwrap_err().to_string().contains("strides"));
        let odd_pads = Op::Nn(NnOp::Conv(Conv {
            group: 1,
            pads: vec![1, 1, 1],
            ..Default::default()
        }));
        assert!(odd_pads.validate().unwrap_err().to_string().contains("pads"));
        assert!(max_pool(vec![3, 3], vec![2, 2]).validate().is_ok());
        assert!(
            max_pool(vec![], vec![])
                .validate()
                .unwrap_err()
                .to_string()
                .contains("kernel_shape")
        );
        assert!(max_pool(vec![3, 0], vec![]).validate().is_err());
        assert!(max_pool(vec![3, 3], vec![0, 1]).validate().is_err());
    }
}
