//! String ops:
//! - [StringNormalizer](https://onnx.ai/onnx/operators/onnx__StringNormalizer.html), opset 10+.
//! - [StringConcat](https://onnx.ai/onnx/operators/onnx__StringConcat.html), opset 20+.
//! - [StringSplit](https://onnx.ai/onnx/operators/onnx__StringSplit.html), opset 20+.
//! - [RegexFullMatch](https://onnx.ai/onnx/operators/onnx__RegexFullMatch.html), opset 20+
//!   (RE2 syntax, evaluated with the `regex` crate whose syntax is RE2's minus a few rarely
//!   used escapes).
//! - [TfIdfVectorizer](https://onnx.ai/onnx/operators/onnx__TfIdfVectorizer.html), opset 9+.

use super::input_shape;
use crate::error::{OpError, Result};
use crate::util::{broadcast_dims, broadcast_map, checked_numel, dtype_only};
use crate::value::{Args, Dim, InferInput, TensorType, ValueType};
use kiln_tensor::{DType, Data, Tensor, broadcast_shapes};
use std::collections::{HashMap, HashSet};

fn strings_of(t: &Tensor, index: usize) -> Result<&[String]> {
    t.as_slice::<String>()
        .map_err(|_| OpError::UnsupportedDType { index, got: t.dtype() })
}

/// `case_change_action` of StringNormalizer.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum CaseChange {
    None,
    Lower,
    Upper,
}

/// Drops stopword elements of a `[C]` or `[1, C]` string tensor, then changes case.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct StringNormalizer {
    pub case_change: CaseChange,
    pub case_sensitive: bool,
    pub stopwords: Vec<String>,
    /// Kept for completeness; case mapping is Unicode's default (locale independent).
    pub locale: String,
}

impl StringNormalizer {
    pub fn name(&self) -> &'static str {
        "StringNormalizer"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let v = strings_of(x, 0)?;
        let two_d = match x.shape() {
            [_] => false,
            [1, _] => true,
            s => {
                return Err(OpError::input_shape(0, "[C] or [1, C]", s));
            }
        };
        let stops: HashSet<String> = if self.case_sensitive {
            self.stopwords.iter().cloned().collect()
        } else {
            self.stopwords.iter().map(|s| s.to_lowercase()).collect()
        };
        let mut out: Vec<String> = v
            .iter()
            .filter(|s| {
                if self.case_sensitive {
                    !stops.contains(*s)
                } else {
                    !stops.contains(&s.to_lowercase())
                }
            })
            .map(|s| match self.case_change {
                CaseChange::None => s.clone(),
                CaseChange::Lower => s.to_lowercase(),
                CaseChange::Upper => s.to_uppercase(),
            })
            .collect();
        if out.is_empty() {
            out.push(String::new());
        }
        let shape = if two_d { vec![1, out.len()] } else { vec![out.len()] };
        Ok(smallvec::smallvec![Tensor::from_vec(shape, out)?.into()])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let shape = input_shape(inputs, 0).map(|s| {
            let mut s: Vec<Dim> = s.iter().map(|_| Dim::Sym("normalized".into())).collect();
            if s.len() == 2 {
                s[0] = Dim::Fixed(1);
            }
            s
        });
        Ok(vec![ValueType::Tensor(TensorType {
            dtype: Some(DType::String),
            shape,
        })])
    }
}

/// Elementwise (broadcast) concatenation of two string tensors.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct StringConcat;

impl StringConcat {
    pub fn name(&self) -> &'static str {
        "StringConcat"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let (a, b) = (args.tensor(0)?, args.tensor(1)?);
        let (va, vb) = (strings_of(a, 0)?, strings_of(b, 1)?);
        let shape = broadcast_shapes(a.shape(), b.shape())?;
        let ia = broadcast_map(a.shape(), &shape, 0)?;
        let ib = broadcast_map(b.shape(), &shape, 1)?;
        let out: Vec<String> = ia
            .iter()
            .zip(&ib)
            .map(|(&i, &j)| format!("{}{}", va[i], vb[j]))
            .collect();
        Ok(smallvec::smallvec![Tensor::from_vec(shape, out)?.into()])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let shape = match (input_shape(inputs, 0), input_shape(inputs, 1)) {
            (Some(a), Some(b)) => broadcast_dims(&a, &b),
            _ => None,
        };
        Ok(vec![ValueType::Tensor(TensorType {
            dtype: Some(DType::String),
            shape,
        })])
    }
}

/// Splits each string on a delimiter (runs of whitespace when none), padding to the longest.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct StringSplit {
    /// `None` (or empty in the model) splits on runs of whitespace, ignoring leading and
    /// trailing whitespace, as Python's `str.split()`.
    pub delimiter: Option<String>,
    /// Maximum number of splits; `None` for no limit.
    pub maxsplit: Option<usize>,
}

/// Python's `str.split(None, maxsplit)`.
fn split_whitespace(s: &str, maxsplit: Option<usize>) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = s;
    let mut left = maxsplit.unwrap_or(usize::MAX);
    while left > 0 {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        out.push(rest[..end].to_string());
        rest = &rest[end..];
        left -= 1;
    }
    let rest = rest.trim_start();
    if !rest.is_empty() {
        out.push(rest.to_string());
    }
    out
}

impl StringSplit {
    fn split(&self, s: &str) -> Vec<String> {
        match &self.delimiter {
            None => split_whitespace(s, self.maxsplit),
            Some(d) => match self.maxsplit {
                None => s.split(d.as_str()).map(str::to_string).collect(),
                Some(m) => s.splitn(m.saturating_add(1), d.as_str()).map(str::to_string).collect(),
            },
        }
    }
}

impl StringSplit {
    pub fn name(&self) -> &'static str {
        "StringSplit"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let parts: Vec<Vec<String>> = strings_of(x, 0)?.iter().map(|s| self.split(s)).collect();
        let width = parts.iter().map(Vec::len).max().unwrap_or(0);
        let mut shape = x.shape().to_vec();
        shape.push(width);
        checked_numel(&shape)?;
        let lengths: Vec<i64> = parts.iter().map(|p| p.len() as i64).collect();
        let mut flat = Vec::with_capacity(parts.len() * width);
        for mut p in parts {
            p.resize(width, String::new());
            flat.extend(p);
        }
        Ok(smallvec::smallvec![
            Tensor::from_vec(shape, flat)?.into(),
            Tensor::from_vec(x.shape(), lengths)?.into(),
        ])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let shape = input_shape(inputs, 0);
        let subs = shape.clone().map(|mut s| {
            s.push(Dim::Sym("max_splits".into()));
            s
        });
        Ok(vec![
            ValueType::Tensor(TensorType {
                dtype: Some(DType::String),
                shape: subs,
            }),
            ValueType::Tensor(TensorType {
                dtype: Some(DType::I64),
                shape,
            }),
        ])
    }
}

/// Whether each string matches a pattern in full.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct RegexFullMatch {
    pub pattern: String,
}

impl RegexFullMatch {
    /// Checks that the pattern compiles (the importer calls this to fail early).
    pub fn new(pattern: String) -> Result<RegexFullMatch> {
        let op = RegexFullMatch { pattern };
        op.compile()?;
        Ok(op)
    }
    fn compile(&self) -> Result<regex::Regex> {
        regex::Regex::new(&format!("^(?:{})$", self.pattern))
            .map_err(|e| OpError::attribute("pattern", "a regular expression", format!("{:?} ({e})", self.pattern)))
    }
}

impl RegexFullMatch {
    pub fn name(&self) -> &'static str {
        "RegexFullMatch"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let re = self.compile()?;
        let out: Vec<bool> = strings_of(x, 0)?.iter().map(|s| re.is_match(s)).collect();
        Ok(smallvec::smallvec![Tensor::from_vec(x.shape(), out)?.into()])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        Ok(vec![ValueType::Tensor(TensorType {
            dtype: Some(DType::Bool),
            shape: input_shape(inputs, 0),
        })])
    }
}

/// Weighting of TfIdfVectorizer's counts.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq)]
pub enum TfIdfMode {
    Tf,
    Idf,
    TfIdf,
}

/// The n-gram pool: integers or strings.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub enum NgramPool {
    Ints(Vec<i64>),
    Strings(Vec<String>),
}

impl NgramPool {
    fn len(&self) -> usize {
        match self {
            NgramPool::Ints(v) => v.len(),
            NgramPool::Strings(v) => v.len(),
        }
    }
    fn key(&self, i: usize) -> Key<'_> {
        match self {
            NgramPool::Ints(v) => Key::I(v[i]),
            NgramPool::Strings(v) => Key::S(&v[i]),
        }
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, Copy, PartialEq, Eq, Hash)]
enum Key<'a> {
    I(i64),
    S(&'a str),
}

/// Counts (skip-)n-grams of each row against a pool and weights the counts.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct TfIdfVectorizer {
    pub mode: TfIdfMode,
    pub min_gram_length: usize,
    pub max_gram_length: usize,
    pub max_skip_count: usize,
    /// Start offset in the pool of the n-grams of each length (1-grams first).
    pub ngram_counts: Vec<i64>,
    /// Output column of each n-gram, in pool order.
    pub ngram_indexes: Vec<i64>,
    pub pool: NgramPool,
    /// Per output column; empty when not given.
    pub weights: Vec<f32>,
}

impl TfIdfVectorizer {
    fn output_size(&self) -> usize {
        self.ngram_indexes
            .iter()
            .copied()
            .max()
            .map_or(0, |m| (m.max(-1) + 1) as usize)
    }

    /// n-gram (as pool keys) → output column.
    fn table(&self) -> Result<HashMap<Vec<Key<'_>>, usize>> {
        let total = self.pool.len();
        let mut map = HashMap::new();
        let mut id = 0usize;
        for (i, &start) in self.ngram_counts.iter().enumerate() {
            let n = i + 1;
            let end = self.ngram_counts.get(i + 1).copied().unwrap_or(total as i64);
            if start < 0 || end < start || end as usize > total {
                return Err(OpError::attribute(
                    "ngram_counts",
                    format!("increasing starts within the pool of {total}"),
                    format!("{:?}", self.ngram_counts),
                ));
            }
            let (start, end) = (start as usize, end as usize);
            let count = (end - start) / n;
            if n < self.min_gram_length || n > self.max_gram_length {
                id += count;
                continue;
            }
            for k in 0..count {
                let key: Vec<Key<'_>> = (start + k * n..start + (k + 1) * n).map(|p| self.pool.key(p)).collect();
                let col = self.ngram_indexes.get(id).copied().ok_or_else(|| {
                    OpError::attribute(
                        "ngram_indexes",
                        "one index per n-gram of the pool",
                        format!("{} indexes", self.ngram_indexes.len()),
                    )
                })?;
                let col = usize::try_from(col).map_err(|_| OpError::attribute("ngram_indexes", "values >= 0", col))?;
                map.insert(key, col);
                id += 1;
            }
        }
        Ok(map)
    }
}

impl TfIdfVectorizer {
    pub fn name(&self) -> &'static str {
        "TfIdfVectorizer"
    }
    pub fn eval(&self, args: &Args<'_>) -> Result<crate::Outputs> {
        let x = args.tensor(0)?;
        let keys: Vec<Key<'_>> = match (x.data(), &self.pool) {
            (Data::Str(v), NgramPool::Strings(_)) => v.iter().map(|s| Key::S(s)).collect(),
            (Data::I32(v), NgramPool::Ints(_)) => v.iter().map(|&i| Key::I(i as i64)).collect(),
            (Data::I64(v), NgramPool::Ints(_)) => v.iter().map(|&i| Key::I(i)).collect(),
            _ => {
                return Err(OpError::UnsupportedDType {
                    index: 0,
                    got: x.dtype(),
                });
            }
        };
        let (rows, cols, out_shape) = match x.shape() {
            [] => (1, 1, None),
            [c] => (1, *c, None),
            [b, c] => (*b, *c, Some(*b)),
            s => {
                return Err(OpError::input_shape(0, "[C] or [B, C]", s));
            }
        };
        let size = self.output_size();
        let shape = match out_shape {
            Some(b) => vec![b, size],
            None => vec![size],
        };
        let n_out = checked_numel(&shape)?;
        let table = self.table()?;
        if let Some(&bad) = table.values().find(|&&c| c >= size) {
            return Err(OpError::IndexOutOfRange {
                index: bad as i64,
                size,
            });
        }
        let mut freq = vec![0u64; n_out];
        // No gram is longer than a row and no useful skip reaches past it: bounding both keeps
        // attribute values (from a file) from driving allocation or arithmetic overflow.
        let max_n = self.max_gram_length.min(cols);
        let max_skip = self.max_skip_count.min(cols);
        if max_n >= 1 && self.min_gram_length >= 1 {
            for r in 0..rows {
                let row = &keys[r * cols..(r + 1) * cols];
                let mut start_n = self.min_gram_length;
                for skip in 1..=max_skip + 1 {
                    for s in 0..cols {
                        if skip.saturating_mul(start_n - 1).saturating_add(s) >= cols {
                            break;
                        }
                        let mut gram = Vec::with_capacity(max_n);
                        for n in 1..=max_n {
                            let p = s + skip * (n - 1);
                            if p >= cols {
                                break;
                            }
                            gram.push(row[p]);
                            if n >= start_n
                                && let Some(&col) = table.get(&gram)
                            {
                                freq[r * size + col] += 1;
                            }
                        }
                    }
                    // Unigrams do not depend on the skip: count them once.
                    if start_n == 1 {
                        start_n = 2;
                        if start_n > max_n {
                            break;
                        }
                    }
                }
            }
        }
        let w = &self.weights;
        let out: Vec<f32> = freq
            .iter()
            .enumerate()
            .map(|(p, &f)| {
                let col = p % size.max(1);
                match self.mode {
                    TfIdfMode::Tf => f as f32,
                    TfIdfMode::Idf if w.is_empty() => (f > 0) as u8 as f32,
                    TfIdfMode::Idf => {
                        if f > 0 {
                            w.get(col).copied().unwrap_or(0.0)
                        } else {
                            0.0
                        }
                    }
                    TfIdfMode::TfIdf if w.is_empty() => f as f32,
                    TfIdfMode::TfIdf => w.get(col).copied().unwrap_or(0.0) * f as f32,
                }
            })
            .collect();
        Ok(smallvec::smallvec![Tensor::from_vec(shape, out)?.into()])
    }
    pub fn infer(&self, inputs: &[InferInput<'_>]) -> Result<Vec<ValueType>> {
        let size = Dim::Fixed(self.output_size());
        Ok(vec![match input_shape(inputs, 0) {
            Some(s) if s.len() == 2 => ValueType::Tensor(TensorType::new(DType::F32, vec![s[0].clone(), size])),
            Some(s) if s.len() < 2 => ValueType::Tensor(TensorType::new(DType::F32, vec![size])),
            Some(s) => match crate::util::fixed(&s) {
                Some(s) => return Err(OpError::input_shape(0, "[C] or [B, C]", &s)),
                // Named at evaluation.
                None => dtype_only(Some(DType::F32)),
            },
            None => dtype_only(Some(DType::F32)),
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::*;
    use super::*;

    #[test]
    fn normalizer_drops_stopwords_and_changes_case() {
        let op = StringNormalizer {
            case_change: CaseChange::Upper,
            case_sensitive: false,
            stopwords: vec!["monday".into()],
            locale: String::new(),
        };
        let x = strs(&[1, 4], &["Monday", "tuesday", "MONDAY", "wed"]);
        let y = run(&[Some(&x)], |a| op.eval(a));
        assert_eq!(
            out::<String>(&y[0]),
            (vec![1, 2], vec!["TUESDAY".to_string(), "WED".to_string()])
        );
        let x = strs(&[2], &["monday", "monday"]);
        let y = run(&[Some(&x)], |a| op.eval(a));
        assert_eq!(out::<String>(&y[0]), (vec![1], vec![String::new()]));
    }

    #[test]
    fn concat_broadcasts() {
        let a = strs(&[2], &["a", "b"]);
        let b = strs(&[], &["!"]);
        let y = run(&[Some(&a), Some(&b)], |x| StringConcat.eval(x));
        assert_eq!(
            out::<String>(&y[0]),
            (vec![2], vec!["a!".to_string(), "b!".to_string()])
        );
    }

    #[test]
    fn split_like_python() {
        assert_eq!(split_whitespace("  a b  c ", None), vec!["a", "b", "c"]);
        assert_eq!(split_whitespace("  a b  c ", Some(1)), vec!["a", "b  c "]);
        assert!(split_whitespace("   ", None).is_empty());
        let op = StringSplit {
            delimiter: Some("-".into()),
            maxsplit: None,
        };
        let x = strs(&[2], &["a--b", "c"]);
        let y = run(&[Some(&x)], |a| op.eval(a));
        let (shape, v) = out::<String>(&y[0]);
        assert_eq!(shape, vec![2, 3]);
        assert_eq!(v, vec!["a", "", "b", "c", "", ""]);
        assert_eq!(out::<i64>(&y[1]), (vec![2], vec![3, 1]));
        let op = StringSplit {
            delimiter: Some(".".into()),
            maxsplit: Some(1),
        };
        assert_eq!(op.split("a.b.c"), vec!["a", "b.c"]);
    }

    #[test]
    fn regex_matches_whole_string() {
        let op = RegexFullMatch::new(r"www\.[\w.-]+\.\bcom\b".into()).unwrap();
        let x = strs(&[3], &["www.google.com", "www.facebook.com/x", "xwww.a.com"]);
        let y = run(&[Some(&x)], |a| op.eval(a));
        assert_eq!(out::<bool>(&y[0]).1, vec![true, false, false]);
        assert!(matches!(
            RegexFullMatch::new("(".into()).unwrap_err(),
            OpError::Attribute { attr: "pattern", expected, got } if expected == "a regular expression" && got.starts_with("\"(\"")
        ));
    }

    #[test]
    fn tfidf_counts_bigrams_with_skips() {
        // ONNX test tf_onlybigrams_skip5: X = [1,1,3,3,3,7,8,6,7,5,6,8], bigrams (5,6),(7,8),(6,7)
        // at columns 4,5,6 of 7.
        let op = TfIdfVectorizer {
            mode: TfIdfMode::Tf,
            min_gram_length: 2,
            max_gram_length: 2,
            max_skip_count: 5,
            ngram_counts: vec![0, 4],
            ngram_indexes: (0..7).collect(),
            pool: NgramPool::Ints(vec![2, 3, 5, 4, 5, 6, 7, 8, 6, 7]),
            weights: vec![],
        };
        let x = t(&[12], vec![1i32, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8]);
        let y = run(&[Some(&x)], |a| op.eval(a));
        assert_eq!(out::<f32>(&y[0]), (vec![7], vec![0.0, 0.0, 0.0, 0.0, 1.0, 3.0, 1.0]));
    }
}
