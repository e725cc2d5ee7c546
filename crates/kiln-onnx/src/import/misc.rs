//! Importers for the misc family: ONNX node → typed op of `kiln_ops::misc` (strings, signal,
//! random, `ai.onnx.ml`, `ai.onnx.preview.training`).

use crate::attrs::{NodeCtx, Result};
use kiln_ops::Op;
use kiln_ops::misc::*;
use kiln_tensor::{DType, Tensor};

/// Returns the typed op when `ctx.op_type` belongs to this family, `None` otherwise.
pub fn import(ctx: &NodeCtx<'_>) -> Result<Option<Op>> {
    let op = match ctx.domain {
        "" => default_domain(ctx)?,
        "ai.onnx.ml" => ml_domain(ctx)?,
        "ai.onnx.preview.training" => training_domain(ctx)?,
        _ => None,
    };
    Ok(op.map(Op::Misc))
}

fn usize_attr(ctx: &NodeCtx<'_>, name: &str, v: i64) -> Result<usize> {
    usize::try_from(v).map_err(|_| ctx.attr_err(name, format!("must be >= 0, got {v}")))
}

fn default_domain(ctx: &NodeCtx<'_>) -> Result<Option<MiscOp>> {
    Ok(Some(match ctx.op_type {
        "StringNormalizer" => {
            let case_change = match ctx.attr_string_or("case_change_action", "NONE")?.as_str() {
                "NONE" => CaseChange::None,
                "LOWER" => CaseChange::Lower,
                "UPPER" => CaseChange::Upper,
                other => {
                    return Err(ctx.attr_err("case_change_action", format!("unknown action {other:?}")));
                }
            };
            MiscOp::StringNormalizer(StringNormalizer {
                case_change,
                case_sensitive: ctx.attr_bool_or("is_case_sensitive", false)?,
                stopwords: ctx.attr_strings("stopwords")?.unwrap_or_default(),
                locale: ctx.attr_string_or("locale", "")?,
            })
        }
        "StringConcat" => MiscOp::StringConcat(StringConcat),
        "StringSplit" => MiscOp::StringSplit(StringSplit {
            delimiter: ctx.attr_string("delimiter")?.filter(|d| !d.is_empty()),
            maxsplit: ctx.attr_i64("maxsplit")?.and_then(|m| usize::try_from(m).ok()),
        }),
        "RegexFullMatch" => {
            let pattern = ctx.required("pattern", ctx.attr_string("pattern")?)?;
            MiscOp::RegexFullMatch(RegexFullMatch::new(pattern).map_err(|e| ctx.op_err(e))?)
        }
        "TfIdfVectorizer" => {
            let mode = match ctx.required("mode", ctx.attr_string("mode")?)?.as_str() {
                "TF" => TfIdfMode::Tf,
                "IDF" => TfIdfMode::Idf,
                "TFIDF" => TfIdfMode::TfIdf,
                other => return Err(ctx.attr_err("mode", format!("unknown mode {other:?}"))),
            };
            let pool = match (ctx.attr_i64s("pool_int64s")?, ctx.attr_strings("pool_strings")?) {
                (Some(p), None) => NgramPool::Ints(p),
                (None, Some(p)) => NgramPool::Strings(p),
                _ => {
                    return Err(ctx.node_err("exactly one of pool_int64s and pool_strings must be given"));
                }
            };
            let min = ctx.required("min_gram_length", ctx.attr_i64("min_gram_length")?)?;
            let max = ctx.required("max_gram_length", ctx.attr_i64("max_gram_length")?)?;
            let skip = ctx.required("max_skip_count", ctx.attr_i64("max_skip_count")?)?;
            MiscOp::TfIdfVectorizer(TfIdfVectorizer {
                mode,
                min_gram_length: usize_attr(ctx, "min_gram_length", min)?,
                max_gram_length: usize_attr(ctx, "max_gram_length", max)?,
                max_skip_count: usize_attr(ctx, "max_skip_count", skip)?,
                ngram_counts: ctx.required("ngram_counts", ctx.attr_i64s("ngram_counts")?)?,
                ngram_indexes: ctx.required("ngram_indexes", ctx.attr_i64s("ngram_indexes")?)?,
                pool,
                weights: ctx.attr_f32s("weights")?.unwrap_or_default(),
            })
        }
        "DFT" => MiscOp::Dft(Dft {
            axis: if ctx.opset < 20 {
                Some(ctx.attr_i64_or("axis", 1)?)
            } else {
                None
            },
            inverse: ctx.attr_bool_or("inverse", false)?,
            onesided: ctx.attr_bool_or("onesided", false)?,
        }),
        "STFT" => MiscOp::Stft(Stft {
            onesided: ctx.attr_bool_or("onesided", true)?,
        }),
        "HannWindow" | "HammingWindow" | "BlackmanWindow" => {
            let kind = match ctx.op_type {
                "HannWindow" => WindowKind::Hann,
                "HammingWindow" => WindowKind::Hamming,
                _ => WindowKind::Blackman,
            };
            MiscOp::Window(Window {
                kind,
                periodic: ctx.attr_bool_or("periodic", true)?,
                dtype: ctx.attr_dtype("output_datatype")?.unwrap_or(DType::F32),
            })
        }
        "RandomUniform" => MiscOp::RandomUniform(RandomUniform {
            dtype: ctx.attr_dtype("dtype")?.unwrap_or(DType::F32),
            low: ctx.attr_f32_or("low", 0.0)?,
            high: ctx.attr_f32_or("high", 1.0)?,
            seed: ctx.attr_f32("seed")?,
            shape: ctx.required("shape", ctx.attr_i64s("shape")?)?,
        }),
        "RandomNormal" => MiscOp::RandomNormal(RandomNormal {
            dtype: ctx.attr_dtype("dtype")?.unwrap_or(DType::F32),
            mean: ctx.attr_f32_or("mean", 0.0)?,
            scale: ctx.attr_f32_or("scale", 1.0)?,
            seed: ctx.attr_f32("seed")?,
            shape: ctx.required("shape", ctx.attr_i64s("shape")?)?,
        }),
        "RandomUniformLike" => MiscOp::RandomLike(RandomLike {
            normal: false,
            dtype: ctx.attr_dtype("dtype")?,
            a: ctx.attr_f32_or("low", 0.0)?,
            b: ctx.attr_f32_or("high", 1.0)?,
            seed: ctx.attr_f32("seed")?,
        }),
        "RandomNormalLike" => MiscOp::RandomLike(RandomLike {
            normal: true,
            dtype: ctx.attr_dtype("dtype")?,
            a: ctx.attr_f32_or("mean", 0.0)?,
            b: ctx.attr_f32_or("scale", 1.0)?,
            seed: ctx.attr_f32("seed")?,
        }),
        "Bernoulli" => MiscOp::Bernoulli(Bernoulli {
            dtype: ctx.attr_dtype("dtype")?,
            seed: ctx.attr_f32("seed")?,
        }),
        "Multinomial" => {
            let n = ctx.attr_i64_or("sample_size", 1)?;
            MiscOp::Multinomial(Multinomial {
                dtype: ctx.attr_dtype("dtype")?.unwrap_or(DType::I32),
                sample_size: usize_attr(ctx, "sample_size", n)?,
                seed: ctx.attr_f32("seed")?,
            })
        }
        "ImageDecoder" => MiscOp::ImageDecoder(ImageDecoder {
            pixel_format: match ctx.attr_string_or("pixel_format", "RGB")?.as_str() {
                "RGB" => PixelFormat::Rgb,
                "BGR" => PixelFormat::Bgr,
                "Grayscale" => PixelFormat::Grayscale,
                other => {
                    return Err(ctx.attr_err("pixel_format", format!("unknown format {other:?}")));
                }
            },
        }),
        "MelWeightMatrix" => MiscOp::MelWeightMatrix(MelWeightMatrix {
            dtype: ctx.attr_dtype("output_datatype")?.unwrap_or(DType::F32),
        }),
        _ => return Ok(None),
    }))
}

fn vec_tensor<T: kiln_tensor::Element>(ctx: &NodeCtx<'_>, attr: &str, v: Vec<T>) -> Result<Tensor> {
    Tensor::from_vec(vec![v.len()], v).map_err(|e| ctx.attr_err(attr, e.to_string()))
}

/// A list or tensor attribute as a 1-D tensor: the first of `names` present.
fn list_attr(ctx: &NodeCtx<'_>, prefix: &str) -> Result<Option<Tensor>> {
    let tensor_name = format!("{prefix}_tensor");
    if let Some(t) = ctx.attr_tensor(&tensor_name)? {
        let n = t.len();
        return t
            .reshape(vec![n])
            .map(Some)
            .map_err(|e| ctx.attr_err(&tensor_name, e.to_string()));
    }
    let strings = format!("{prefix}_strings");
    if let Some(v) = ctx.attr_strings(&strings)? {
        return vec_tensor(ctx, &strings, v).map(Some);
    }
    let ints = format!("{prefix}_int64s");
    if let Some(v) = ctx.attr_i64s(&ints)? {
        return vec_tensor(ctx, &ints, v).map(Some);
    }
    let floats = format!("{prefix}_floats");
    if let Some(v) = ctx.attr_f32s(&floats)? {
        return vec_tensor(ctx, &floats, v).map(Some);
    }
    Ok(None)
}

/// A float tensor attribute (any float dtype) as f64 values.
fn f64s_attr(ctx: &NodeCtx<'_>, name: &str) -> Result<Option<Vec<f64>>> {
    Ok(ctx.attr_tensor(name)?.map(|t| t.to_f64_vec()))
}

fn ml_domain(ctx: &NodeCtx<'_>) -> Result<Option<MiscOp>> {
    Ok(Some(match ctx.op_type {
        "LabelEncoder" => {
            if ctx.opset < 2 {
                return Err(ctx.node_err("LabelEncoder of ai.onnx.ml opset 1 (classes_strings) is not supported"));
            }
            let keys = ctx.required("keys_*", list_attr(ctx, "keys")?)?;
            let values = ctx.required("values_*", list_attr(ctx, "values")?)?;
            let default = match (ctx.attr_tensor("default_tensor")?, values.dtype()) {
                (Some(t), _) => t
                    .reshape(vec![1])
                    .map_err(|e| ctx.attr_err("default_tensor", e.to_string()))?,
                (None, DType::String) if ctx.has_attr("default_string") => {
                    vec_tensor(ctx, "default_string", vec![ctx.attr_string_or("default_string", "")?])?
                }
                (None, DType::I64) if ctx.has_attr("default_int64") => {
                    vec_tensor(ctx, "default_int64", vec![ctx.attr_i64_or("default_int64", -1)?])?
                }
                (None, DType::F32) if ctx.has_attr("default_float") => {
                    vec_tensor(ctx, "default_float", vec![ctx.attr_f32_or("default_float", -0.0)?])?
                }
                (None, d) => LabelEncoder::default_for(d).map_err(|e| ctx.attr_err("default_*", e.to_string()))?,
            };
            MiscOp::LabelEncoder(LabelEncoder { keys, values, default })
        }
        "TreeEnsemble" => MiscOp::TreeEnsemble(tree_ensemble(ctx)?),
        "ArrayFeatureExtractor" => MiscOp::ArrayFeatureExtractor(ArrayFeatureExtractor),
        "Binarizer" => MiscOp::Binarizer(Binarizer {
            threshold: ctx.attr_f32_or("threshold", 0.0)?,
        }),
        _ => return Ok(None),
    }))
}

fn tree_ensemble(ctx: &NodeCtx<'_>) -> Result<TreeEnsemble> {
    let ints = |name: &str| -> Result<Vec<i64>> { ctx.required(name, ctx.attr_i64s(name)?) };
    let flags = |name: &str| -> Result<Vec<bool>> { Ok(ints(name)?.into_iter().map(|v| v != 0).collect()) };
    let aggregate = match ctx.attr_i64_or("aggregate_function", 1)? {
        0 => AggregateFunction::Average,
        1 => AggregateFunction::Sum,
        2 => AggregateFunction::Min,
        3 => AggregateFunction::Max,
        v => return Err(ctx.attr_err("aggregate_function", format!("unknown value {v}"))),
    };
    let post_transform = match ctx.attr_i64_or("post_transform", 0)? {
        0 => PostTransform::None,
        1 => PostTransform::Softmax,
        2 => PostTransform::Logistic,
        3 => PostTransform::SoftmaxZero,
        4 => PostTransform::Probit,
        v => return Err(ctx.attr_err("post_transform", format!("unknown value {v}"))),
    };
    let modes = ctx.required("nodes_modes", ctx.attr_tensor("nodes_modes")?)?;
    let nodes_modes = modes
        .to_i64_vec()
        .unwrap_or_default()
        .into_iter()
        .map(|m| NodeMode::from_code(m).ok_or_else(|| ctx.attr_err("nodes_modes", format!("unknown mode {m}"))))
        .collect::<Result<Vec<_>>>()?;
    let n_targets = ctx.required("n_targets", ctx.attr_i64("n_targets")?)?;
    Ok(TreeEnsemble {
        aggregate,
        post_transform,
        n_targets: usize_attr(ctx, "n_targets", n_targets)?,
        tree_roots: ints("tree_roots")?,
        nodes_modes,
        nodes_featureids: ints("nodes_featureids")?,
        nodes_splits: ctx.required("nodes_splits", f64s_attr(ctx, "nodes_splits")?)?,
        nodes_truenodeids: ints("nodes_truenodeids")?,
        nodes_trueleafs: flags("nodes_trueleafs")?,
        nodes_falsenodeids: ints("nodes_falsenodeids")?,
        nodes_falseleafs: flags("nodes_falseleafs")?,
        nodes_missing_tracks_true: ctx
            .attr_i64s("nodes_missing_value_tracks_true")?
            .unwrap_or_default()
            .into_iter()
            .map(|v| v != 0)
            .collect(),
        membership_values: f64s_attr(ctx, "membership_values")?.unwrap_or_default(),
        leaf_targetids: ints("leaf_targetids")?,
        leaf_weights: ctx.required("leaf_weights", f64s_attr(ctx, "leaf_weights")?)?,
    })
}

fn training_domain(ctx: &NodeCtx<'_>) -> Result<Option<MiscOp>> {
    Ok(Some(match ctx.op_type {
        "Adagrad" => MiscOp::Adagrad(Adagrad {
            decay_factor: ctx.attr_f32_or("decay_factor", 0.0)?,
            epsilon: ctx.attr_f32_or("epsilon", 0.0)?,
            norm_coefficient: ctx.attr_f32_or("norm_coefficient", 0.0)?,
        }),
        "Adam" => MiscOp::Adam(Adam {
            alpha: ctx.attr_f32_or("alpha", 0.9)?,
            beta: ctx.attr_f32_or("beta", 0.999)?,
            epsilon: ctx.attr_f32_or("epsilon", 0.0)?,
            norm_coefficient: ctx.attr_f32_or("norm_coefficient", 0.0)?,
            norm_coefficient_post: ctx.attr_f32_or("norm_coefficient_post", 0.0)?,
        }),
        "Momentum" => MiscOp::Momentum(Momentum {
            alpha: ctx.required("alpha", ctx.attr_f32("alpha")?)?,
            beta: ctx.required("beta", ctx.attr_f32("beta")?)?,
            nesterov: match ctx.required("mode", ctx.attr_string("mode")?)?.as_str() {
                "standard" => false,
                "nesterov" => true,
                other => return Err(ctx.attr_err("mode", format!("unknown mode {other:?}"))),
            },
            norm_coefficient: ctx.required("norm_coefficient", ctx.attr_f32("norm_coefficient")?)?,
        }),
        _ => return Ok(None),
    }))
}
