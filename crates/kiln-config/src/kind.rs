//! The value type of an option (`Kind`): what it accepts, how a file's spelling of it is
//! normalised (YAML `3.0` for an integer, `"a,b"` for a list, ...), how it is described in
//! errors and listings, and its JSON Schema.

use serde_json::{Map, Number, Value, json};

/// A value that is not of its option's kind (`Kind::expected` says what is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invalid;

/// The type and constraints of an option's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// `true` or `false`.
    Bool,
    /// `true`/`false` or `0`/`1` (HTP writes flags as integers).
    Bit,
    /// An integer in `min..=max` (an integral float such as `3.0` is accepted).
    Int { min: i64, max: i64 },
    /// A number in the range; either end may be exclusive.
    Float {
        min: f64,
        max: f64,
        min_exclusive: bool,
        max_exclusive: bool,
    },
    /// Text (a number written unquoted in YAML is taken as its text).
    Str,
    /// A file or directory path.
    Path,
    /// One of the names (matched ignoring case, stored as spelled here).
    Choice(&'static [&'static str]),
    /// A list of names from the choices.
    ChoiceList(&'static [&'static str]),
    /// A list of strings, or one comma-separated string.
    StrList,
    /// A list of integers, or one string of integers separated by spaces or commas.
    IntList,
    /// Symbol bindings: a mapping `{batch: 1}`, a list of `[name, value]` pairs or `name=value` strings.
    Symbols,
    /// A list of symbol-binding sets: a list of mappings, or one string of sets separated by
    /// `;` (`"h=640,w=640; h=320,w=320"`).
    SymbolSets,
    /// Any JSON value, kept as written.
    Json,
    /// `null`, or a value of the inner kind.
    Nullable(&'static Kind),
}

pub const fn int(min: i64, max: i64) -> Kind {
    Kind::Int { min, max }
}

/// A non-negative integer.
pub const UINT: Kind = Kind::Int { min: 0, max: i64::MAX };
/// A positive integer.
pub const POSITIVE: Kind = Kind::Int { min: 1, max: i64::MAX };
/// Any integer.
pub const INT: Kind = Kind::Int {
    min: i64::MIN,
    max: i64::MAX,
};

pub const fn float(min: f64, max: f64) -> Kind {
    Kind::Float {
        min,
        max,
        min_exclusive: false,
        max_exclusive: false,
    }
}

/// A float in `(min, max]`.
pub const fn float_open_min(min: f64, max: f64) -> Kind {
    Kind::Float {
        min,
        max,
        min_exclusive: true,
        max_exclusive: false,
    }
}

/// A float in `[min, max)`.
pub const fn float_open_max(min: f64, max: f64) -> Kind {
    Kind::Float {
        min,
        max,
        min_exclusive: false,
        max_exclusive: true,
    }
}

pub const ANY_FLOAT: Kind = float(f64::NEG_INFINITY, f64::INFINITY);

impl Kind {
    /// Short type name for listings.
    pub fn type_name(&self) -> String {
        match self {
            Kind::Bool => "bool".into(),
            Kind::Bit => "bool (or 0/1)".into(),
            Kind::Int { .. } => "int".into(),
            Kind::Float { .. } => "float".into(),
            Kind::Str => "string".into(),
            Kind::Path => "path".into(),
            Kind::Choice(_) => "enum".into(),
            Kind::ChoiceList(_) => "list of enum".into(),
            Kind::StrList => "list of string".into(),
            Kind::IntList => "list of int".into(),
            Kind::Symbols => "map of string to int".into(),
            Kind::SymbolSets => "list of maps of string to int".into(),
            Kind::Json => "any".into(),
            Kind::Nullable(k) => format!("{} or null", k.type_name()),
        }
    }

    /// The allowed values, for listings (`""` when any value of the type is allowed).
    pub fn allowed(&self) -> String {
        match self {
            Kind::Int { min, max } => match (*min, *max) {
                (i64::MIN, i64::MAX) => String::new(),
                (lo, i64::MAX) => format!(">= {lo}"),
                (lo, hi) => format!("{lo}..={hi}"),
            },
            Kind::Float { .. } => float_range(self).unwrap_or_default(),
            Kind::Choice(c) | Kind::ChoiceList(c) => c.join(" | "),
            Kind::Bit => "true | false | 0 | 1".into(),
            Kind::Nullable(k) => k.allowed(),
            _ => String::new(),
        }
    }

    /// What a value must look like, for error messages ("an integer in 0..=3").
    pub fn expected(&self) -> String {
        match self {
            Kind::Bool => "true or false".into(),
            Kind::Bit => "true, false, 0 or 1".into(),
            Kind::Int { min, max } => match (*min, *max) {
                (i64::MIN, i64::MAX) => "an integer".into(),
                (lo, i64::MAX) => format!("an integer >= {lo}"),
                (lo, hi) => format!("an integer in {lo}..={hi}"),
            },
            Kind::Float { .. } => match float_range(self) {
                Some(r) => format!("a number in {r}"),
                None => "a number".into(),
            },
            Kind::Str => "a string".into(),
            Kind::Path => "a path (string)".into(),
            Kind::Choice(c) => format!("one of {}", c.join(", ")),
            Kind::ChoiceList(c) => format!("a list of: {}", c.join(", ")),
            Kind::StrList => "a list of strings (or one comma-separated string)".into(),
            Kind::IntList => "a list of integers (or one string of integers)".into(),
            Kind::Symbols => "a mapping of symbol names to non-negative integers (e.g. {batch: 1})".into(),
            Kind::SymbolSets => {
                "a list of mappings of symbol names to non-negative integers (e.g. [{h: 640, w: 640}, {h: 320, w: 320}] or \"h=640,w=640; h=320,w=320\")".into()
            }
            Kind::Json => "any value".into(),
            Kind::Nullable(k) => format!("null or {}", k.expected()),
        }
    }

    /// Checks `v` and returns it in the one form the typed field deserializes from.
    /// `Err(Invalid)` means "not what `expected()` describes".
    pub fn normalize(&self, v: &Value) -> Result<Value, Invalid> {
        match self {
            Kind::Bool => v.as_bool().map(Value::Bool).ok_or(Invalid),
            Kind::Bit => match v {
                Value::Bool(b) => Ok(Value::Bool(*b)),
                Value::Number(_) => match as_int(v) {
                    Some(0) => Ok(Value::Bool(false)),
                    Some(1) => Ok(Value::Bool(true)),
                    _ => Err(Invalid),
                },
                _ => Err(Invalid),
            },
            Kind::Int { min, max } => {
                let i = as_int(v).ok_or(Invalid)?;
                if i < *min || i > *max {
                    return Err(Invalid);
                }
                Ok(Value::Number(Number::from(i)))
            }
            Kind::Float {
                min,
                max,
                min_exclusive,
                max_exclusive,
            } => {
                let x = v.as_f64().ok_or(Invalid)?;
                let lo_ok = if *min_exclusive { x > *min } else { x >= *min };
                let hi_ok = if *max_exclusive { x < *max } else { x <= *max };
                if !(x.is_finite() && lo_ok && hi_ok) {
                    return Err(Invalid);
                }
                Number::from_f64(x).map(Value::Number).ok_or(Invalid)
            }
            Kind::Str => match v {
                Value::String(_) => Ok(v.clone()),
                Value::Number(n) => Ok(Value::String(n.to_string())),
                _ => Err(Invalid),
            },
            Kind::Path => match v {
                Value::String(s) if !s.is_empty() => Ok(v.clone()),
                _ => Err(Invalid),
            },
            Kind::Choice(choices) => {
                let s = scalar_text(v).ok_or(Invalid)?;
                choice(choices, &s).map(|c| Value::String(c.to_string())).ok_or(Invalid)
            }
            Kind::ChoiceList(choices) => {
                let items = match v {
                    Value::Array(a) => a.clone(),
                    Value::String(s) => split_list(s).into_iter().map(Value::String).collect(),
                    _ => return Err(Invalid),
                };
                let mut out = Vec::new();
                for it in &items {
                    let s = scalar_text(it).ok_or(Invalid)?;
                    out.push(Value::String(choice(choices, &s).ok_or(Invalid)?.to_string()));
                }
                Ok(Value::Array(out))
            }
            Kind::StrList => match v {
                Value::Array(a) => a
                    .iter()
                    .map(|x| scalar_text(x).map(Value::String).ok_or(Invalid))
                    .collect::<Result<Vec<_>, _>>()
                    .map(Value::Array),
                Value::String(s) => Ok(Value::Array(split_list(s).into_iter().map(Value::String).collect())),
                _ => Err(Invalid),
            },
            Kind::IntList => {
                let items: Vec<Value> = match v {
                    Value::Array(a) => a.clone(),
                    Value::Number(_) => vec![v.clone()],
                    Value::String(s) => {
                        let mut out = Vec::new();
                        for tok in s
                            .split(|c: char| c.is_whitespace() || c == ',')
                            .filter(|t| !t.is_empty())
                        {
                            out.push(Value::Number(Number::from(tok.parse::<i64>().map_err(|_| Invalid)?)));
                        }
                        out
                    }
                    _ => return Err(Invalid),
                };
                items
                    .iter()
                    .map(|x| as_int(x).map(|i| Value::Number(Number::from(i))).ok_or(Invalid))
                    .collect::<Result<Vec<_>, _>>()
                    .map(Value::Array)
            }
            Kind::Symbols => normalize_symbols(v),
            Kind::SymbolSets => match v {
                Value::Array(sets) => sets
                    .iter()
                    .map(normalize_symbols)
                    .collect::<Result<Vec<_>, _>>()
                    .map(Value::Array),
                Value::String(s) => s
                    .split(';')
                    .filter(|p| !p.trim().is_empty())
                    .map(|p| normalize_symbols(&Value::String(p.to_string())))
                    .collect::<Result<Vec<_>, _>>()
                    .map(Value::Array),
                _ => Err(Invalid),
            },
            Kind::Json => Ok(v.clone()),
            Kind::Nullable(k) => match v {
                Value::Null => Ok(Value::Null),
                _ => k.normalize(v),
            },
        }
    }

    /// The JSON Schema (draft 2020-12) of a value of this kind.
    pub fn schema(&self) -> Value {
        match self {
            Kind::Bool => json!({"type": "boolean"}),
            Kind::Bit => json!({"oneOf": [{"type": "boolean"}, {"enum": [0, 1]}]}),
            Kind::Int { min, max } => {
                let mut m = Map::new();
                m.insert("type".into(), json!("integer"));
                if *min != i64::MIN {
                    m.insert("minimum".into(), json!(min));
                }
                if *max != i64::MAX {
                    m.insert("maximum".into(), json!(max));
                }
                Value::Object(m)
            }
            Kind::Float {
                min,
                max,
                min_exclusive,
                max_exclusive,
            } => {
                let mut m = Map::new();
                m.insert("type".into(), json!("number"));
                if min.is_finite() {
                    let key = if *min_exclusive { "exclusiveMinimum" } else { "minimum" };
                    m.insert(key.into(), json!(min));
                }
                if max.is_finite() {
                    let key = if *max_exclusive { "exclusiveMaximum" } else { "maximum" };
                    m.insert(key.into(), json!(max));
                }
                Value::Object(m)
            }
            Kind::Str => json!({"type": ["string", "number"]}),
            Kind::Path => json!({"type": "string", "minLength": 1}),
            Kind::Choice(c) => json!({"type": "string", "enum": c}),
            Kind::ChoiceList(c) => json!({"type": "array", "items": {"type": "string", "enum": c}}),
            Kind::StrList => json!({"oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}]}),
            Kind::IntList => json!({"oneOf": [
                {"type": "array", "items": {"type": "integer"}}, {"type": "integer"}, {"type": "string"}
            ]}),
            Kind::Symbols => json!({"oneOf": [
                {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
                {"type": "array"},
                {"type": "string"}
            ]}),
            Kind::SymbolSets => json!({"oneOf": [
                {"type": "array", "items": Kind::Symbols.schema()},
                {"type": "string"}
            ]}),
            Kind::Json => json!({}),
            Kind::Nullable(k) => json!({"anyOf": [k.schema(), {"type": "null"}]}),
        }
    }
}

fn float_range(k: &Kind) -> Option<String> {
    let Kind::Float {
        min,
        max,
        min_exclusive,
        max_exclusive,
    } = k
    else {
        return None;
    };
    match (min.is_finite(), max.is_finite()) {
        (false, false) => None,
        (true, false) => Some(format!("{} {min}", if *min_exclusive { ">" } else { ">=" })),
        (false, true) => Some(format!("{} {max}", if *max_exclusive { "<" } else { "<=" })),
        (true, true) => Some(format!(
            "{}{min}, {max}{}",
            if *min_exclusive { "(" } else { "[" },
            if *max_exclusive { ")" } else { "]" }
        )),
    }
}

/// An integer, from an integer or an integral float (HTP writes `"O": 3.0`).
pub fn as_int(v: &Value) -> Option<i64> {
    let Value::Number(n) = v else { return None };
    if let Some(i) = n.as_i64() {
        return Some(i);
    }
    if n.is_u64() {
        return None; // above i64::MAX
    }
    let f = n.as_f64()?;
    if f.fract() == 0.0 && f.abs() < 9.0e15 {
        Some(f as i64)
    } else {
        None
    }
}

fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn choice(choices: &[&'static str], s: &str) -> Option<&'static str> {
    choices
        .iter()
        .find(|c| **c == s)
        .or_else(|| choices.iter().find(|c| c.eq_ignore_ascii_case(s)))
        .copied()
}

fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(String::from)
        .collect()
}

fn symbol_value(v: &Value) -> Option<u64> {
    as_int(v).and_then(|i| u64::try_from(i).ok())
}

fn normalize_symbols(v: &Value) -> Result<Value, Invalid> {
    let mut out = Map::new();
    let mut put = |name: &str, value: u64| -> Result<(), Invalid> {
        let name = name.trim();
        if name.is_empty() {
            return Err(Invalid);
        }
        out.insert(name.to_string(), Value::Number(Number::from(value)));
        Ok(())
    };
    let parse_pair = |s: &str| -> Option<(String, u64)> {
        let (n, x) = s.split_once('=').or_else(|| s.split_once(':'))?;
        Some((n.trim().to_string(), x.trim().parse().ok()?))
    };
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                put(k, symbol_value(x).ok_or(Invalid)?)?;
            }
        }
        Value::Array(items) => {
            for it in items {
                match it {
                    Value::Array(pair) => match pair.as_slice() {
                        [Value::String(n), x] => put(n, symbol_value(x).ok_or(Invalid)?)?,
                        _ => return Err(Invalid),
                    },
                    Value::String(s) => {
                        let (n, x) = parse_pair(s).ok_or(Invalid)?;
                        put(&n, x)?;
                    }
                    Value::Object(m) => {
                        for (k, x) in m {
                            put(k, symbol_value(x).ok_or(Invalid)?)?;
                        }
                    }
                    _ => return Err(Invalid),
                }
            }
        }
        Value::String(s) => {
            for part in s
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|p| !p.is_empty())
            {
                let (n, x) = parse_pair(part).ok_or(Invalid)?;
                put(&n, x)?;
            }
        }
        _ => return Err(Invalid),
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn ints_accept_integral_floats_and_check_range() {
        let k = int(0, 3);
        assert_eq!(k.normalize(&json!(3.0)), Ok(json!(3)));
        assert_eq!(k.normalize(&json!(2)), Ok(json!(2)));
        assert_eq!(k.normalize(&json!(4)), Err(Invalid));
        assert_eq!(k.normalize(&json!(2.5)), Err(Invalid));
        assert_eq!(k.normalize(&json!("2")), Err(Invalid));
        assert_eq!(k.expected(), "an integer in 0..=3");
    }

    #[test]
    fn float_ranges_respect_exclusive_ends() {
        let k = float_open_min(0.0, 1.0);
        assert_eq!(k.normalize(&json!(0.0)), Err(Invalid));
        assert_eq!(k.normalize(&json!(1)), Ok(json!(1.0)));
        assert_eq!(k.expected(), "a number in (0, 1]");
        assert_eq!(float(90.0, 100.0).expected(), "a number in [90, 100]");
    }

    #[test]
    fn choices_match_ignoring_case_and_store_the_canonical_spelling() {
        let k = Kind::Choice(&["AxiRd", "KernelUtil"]);
        assert_eq!(k.normalize(&json!("kernelutil")), Ok(json!("KernelUtil")));
        assert_eq!(k.normalize(&json!("Axi")), Err(Invalid));
    }

    #[test]
    fn symbols_come_in_three_spellings() {
        let want = json!({"batch": 1, "seq": 128});
        assert_eq!(
            Kind::Symbols.normalize(&json!({"batch": 1, "seq": 128})),
            Ok(want.clone())
        );
        assert_eq!(
            Kind::Symbols.normalize(&json!([["batch", 1], ["seq", 128]])),
            Ok(want.clone())
        );
        assert_eq!(Kind::Symbols.normalize(&json!("batch=1,seq=128")), Ok(want));
        assert_eq!(Kind::Symbols.normalize(&json!({"batch": -1})), Err(Invalid));
    }

    #[test]
    fn symbol_sets_are_lists_or_one_string() {
        let want = json!([{"h": 640, "w": 640}, {"h": 320, "w": 320}]);
        let list = json!([{"h": 640, "w": 640}, "h=320,w=320"]);
        assert_eq!(Kind::SymbolSets.normalize(&list), Ok(want.clone()));
        assert_eq!(Kind::SymbolSets.normalize(&json!("h=640,w=640; h=320,w=320")), Ok(want));
        assert_eq!(Kind::SymbolSets.normalize(&json!([{"h": -1}])), Err(Invalid));
        assert_eq!(Kind::SymbolSets.normalize(&json!(3)), Err(Invalid));
    }

    #[test]
    fn lists_accept_one_string() {
        assert_eq!(Kind::StrList.normalize(&json!("a, b")), Ok(json!(["a", "b"])));
        assert_eq!(Kind::IntList.normalize(&json!("1 2 0")), Ok(json!([1, 2, 0])));
        assert_eq!(Kind::IntList.normalize(&json!(4)), Ok(json!([4])));
    }
}
