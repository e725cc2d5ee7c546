//! Family module: miscellaneous ops that fit no other family.
//!
//! - [`strings`]: StringNormalizer, StringConcat, StringSplit, RegexFullMatch, TfIdfVectorizer.
//! - [`signal`]: DFT, STFT, HannWindow, HammingWindow, BlackmanWindow, MelWeightMatrix.
//! - [`random`]: RandomUniform(Like), RandomNormal(Like), Bernoulli, Multinomial.
//! - [`ml`]: the `ai.onnx.ml` ops LabelEncoder, TreeEnsemble, ArrayFeatureExtractor, Binarizer.
//! - [`training`]: the `ai.onnx.preview.training` optimisers Adagrad, Adam, Momentum.
//! - [`image`]: ImageDecoder.
//!
//! Each submodule cites the ONNX operator specs and opset ranges it covers.

pub mod image;
pub mod ml;
pub mod random;
pub mod signal;
pub mod strings;
pub mod training;

pub use image::{ImageDecoder, PixelFormat};
pub use ml::{
    AggregateFunction, ArrayFeatureExtractor, Binarizer, LabelEncoder, NodeMode, PostTransform, TreeEnsemble,
};
pub use random::{Bernoulli, Multinomial, RandomLike, RandomNormal, RandomUniform};
pub use signal::{Dft, MelWeightMatrix, Stft, Window, WindowKind};
pub use training::{Adagrad, Adam, Momentum};

pub use strings::{
    CaseChange, NgramPool, RegexFullMatch, StringConcat, StringNormalizer, StringSplit, TfIdfMode, TfIdfVectorizer,
};

use crate::error::{OpError, Result};
use crate::value::{InferInput, ValueType};
use kiln_tensor::{DType, Tensor};

op_family! {
    /// The misc family.
    pub enum MiscOp {
        StringNormalizer(StringNormalizer) = StringNormalizer::name,
        StringConcat(StringConcat) = StringConcat::name,
        StringSplit(StringSplit) = StringSplit::name,
        RegexFullMatch(RegexFullMatch) = RegexFullMatch::name,
        TfIdfVectorizer(TfIdfVectorizer) = TfIdfVectorizer::name,
        Dft(Dft) = Dft::name,
        Stft(Stft) = Stft::name,
        Window(Window) = Window::name,
        MelWeightMatrix(MelWeightMatrix) = MelWeightMatrix::name,
        RandomUniform(RandomUniform) = RandomUniform::name,
        RandomNormal(RandomNormal) = RandomNormal::name,
        RandomLike(RandomLike) = RandomLike::name,
        Bernoulli(Bernoulli) = Bernoulli::name,
        Multinomial(Multinomial) = Multinomial::name,
        LabelEncoder(LabelEncoder) = LabelEncoder::name,
        TreeEnsemble(TreeEnsemble) = TreeEnsemble::name,
        ArrayFeatureExtractor(ArrayFeatureExtractor) = ArrayFeatureExtractor::name,
        Binarizer(Binarizer) = Binarizer::name,
        Adagrad(Adagrad) = Adagrad::name,
        Adam(Adam) = Adam::name,
        Momentum(Momentum) = Momentum::name,
        ImageDecoder(ImageDecoder) = ImageDecoder::name,
    }
}

/// Builds a tensor of `dtype` from f64 values, converting as numpy's `astype` does for the
/// usual cases (floats rounded to the target precision, integers truncated toward zero,
/// non-zero is `true`). Float8/fp4 saturate; strings are refused.
pub(crate) fn tensor_from_f64(dtype: DType, shape: Vec<usize>, v: &[f64]) -> Result<Tensor> {
    if dtype == DType::String {
        return Err(OpError::UnsupportedDType { index: 0, got: dtype });
    }
    Ok(Tensor::from_f64(dtype, shape, v)?)
}

/// Refuses a non-float tensor (for ops defined on float inputs only).
pub(crate) fn require_float(t: &Tensor, index: usize) -> Result<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(OpError::UnsupportedDType { index, got: t.dtype() })
    }
}

/// The shape of input `i` when fully known.
pub(crate) fn fixed_shape(inputs: &[InferInput<'_>], i: usize) -> Option<Vec<usize>> {
    inputs.get(i).and_then(|x| x.ty.tensor()).and_then(|t| t.fixed_shape())
}

pub(crate) use crate::util::present;

/// The static shape (possibly symbolic) of input `i` when its rank is known.
pub(crate) fn input_shape(inputs: &[InferInput<'_>], i: usize) -> Option<Vec<crate::value::Dim>> {
    inputs.get(i).and_then(|x| x.ty.tensor()).and_then(|t| t.shape.clone())
}

/// A tensor type with dtype and rank known, every dim a fresh symbol.
pub(crate) fn rank_only(dtype: Option<DType>, rank: usize) -> ValueType {
    ValueType::Tensor(crate::value::TensorType {
        dtype,
        shape: Some((0..rank).map(|_| crate::value::Dim::fresh()).collect()),
    })
}

#[cfg(test)]
pub(crate) mod test_util {
    use crate::value::{Args, Value};
    use kiln_tensor::{Element, Tensor};

    pub fn t<T: Element>(shape: &[usize], v: Vec<T>) -> Value {
        Value::Tensor(Tensor::from_vec(shape, v).unwrap())
    }

    pub fn strs(shape: &[usize], v: &[&str]) -> Value {
        t(shape, v.iter().map(|s| s.to_string()).collect::<Vec<String>>())
    }

    /// Runs `f` on the given inputs (None = absent).
    pub fn run<F>(inputs: &[Option<&Value>], f: F) -> Vec<Value>
    where
        F: FnOnce(&Args<'_>) -> crate::Result<crate::Outputs>,
    {
        f(&Args::new(inputs)).unwrap().into_vec()
    }

    pub fn out<T: Element>(v: &Value) -> (Vec<usize>, Vec<T>) {
        let t = v.as_tensor().unwrap();
        (t.shape().to_vec(), t.as_slice::<T>().unwrap().to_vec())
    }

    pub fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
    }
}
