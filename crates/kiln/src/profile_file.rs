//! Quantization profiles in Glow's YAML layout (pytorch/glow
//! `lib/Quantization/Serialization.cpp`), as qaic's `dump_profile` / `load_profile` exchange
//! them: three documents, the tool version, the graph hash, then one entry per profiled tensor.
//!
//! ```yaml
//! ---
//! GlowToolsVersion: 'kiln 0.1.0'
//! ---
//! GraphPreLowerHash: '3f2a...'
//! ---
//! - NodeOutputName: 'conv1_out'
//!   Min: -1.25
//!   Max: 6.5
//!   Histogram: [ 0, 3, 17, ... ]
//! ```
//!
//! kiln names an entry by its tensor (ONNX value) name. Min and Max are written in Rust's
//! shortest round-trip form, so writing a parsed profile gives the same bytes. The reader takes
//! block or flow lists, quoted or bare scalars, comments and blank lines.

use kiln_compiler::quantize::calib::Histogram;

/// A parsed profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub version: String,
    pub hash: String,
    /// Histograms by tensor name, in file order.
    pub entries: Vec<(String, Histogram)>,
}

/// Most bins a profile entry may have (qaic's histograms are 512 by default).
const MAX_BINS: usize = 1 << 20;

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The profile as YAML text.
pub fn write(p: &Profile) -> String {
    let mut s = String::new();
    s.push_str("---\n");
    s.push_str(&format!("GlowToolsVersion: {}\n", quote(&p.version)));
    s.push_str("---\n");
    s.push_str(&format!("GraphPreLowerHash: {}\n", quote(&p.hash)));
    s.push_str("---\n");
    if p.entries.is_empty() {
        s.push_str("[]\n");
    }
    for (name, h) in &p.entries {
        s.push_str(&format!("- NodeOutputName: {}\n", quote(name)));
        s.push_str(&format!("  Min: {:?}\n", h.min));
        s.push_str(&format!("  Max: {:?}\n", h.max));
        let counts: Vec<String> = h.counts.iter().map(u64::to_string).collect();
        s.push_str(&format!("  Histogram: [ {} ]\n", counts.join(", ")));
    }
    s
}

fn unquote(v: &str) -> String {
    let v = v.trim();
    if v.len() >= 2 && v.starts_with('\'') && v.ends_with('\'') {
        v.get(1..v.len() - 1).unwrap_or_default().replace("''", "'")
    } else if v.len() >= 2 && v.starts_with('"') && v.ends_with('"') {
        v.get(1..v.len() - 1).unwrap_or_default().replace("\\\"", "\"")
    } else {
        v.to_string()
    }
}

/// Strips a `#` comment that is not inside quotes.
fn strip_comment(line: &str) -> &str {
    let mut quote: Option<char> = None;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '#') if line.get(..i).is_some_and(|p| p.is_empty() || p.ends_with(' ')) => {
                return line.get(..i).unwrap_or(line);
            }
            _ => {}
        }
    }
    line
}

#[derive(Default)]
struct Entry {
    name: Option<String>,
    min: Option<f32>,
    max: Option<f32>,
    counts: Option<Vec<u64>>,
    /// Inside a block list of counts.
    in_block: bool,
}

fn parse_counts(list: &str, line: usize) -> Result<Vec<u64>, String> {
    let inner = list.trim();
    let inner = inner
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .ok_or_else(|| format!("line {line}: Histogram: expected a [ ... ] list or a block list"))?;
    let mut out = Vec::new();
    for item in inner.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if out.len() >= MAX_BINS {
            return Err(format!("line {line}: more than {MAX_BINS} histogram bins"));
        }
        out.push(parse_count(item, line)?);
    }
    Ok(out)
}

fn parse_count(s: &str, line: usize) -> Result<u64, String> {
    let s = unquote(s);
    if let Ok(v) = s.parse::<u64>() {
        return Ok(v);
    }
    // Glow writes float counts in some versions ("12.0").
    match s.parse::<f64>() {
        Ok(v) if v >= 0.0 && v.fract() == 0.0 && v < 2f64.powi(63) => Ok(v as u64),
        _ => Err(format!(
            "line {line}: histogram count '{s}' is not a non-negative integer"
        )),
    }
}

fn finish(e: Entry, out: &mut Vec<(String, Histogram)>) -> Result<(), String> {
    let name = e.name.ok_or("an entry without NodeOutputName")?;
    let what = |k: &str| format!("entry '{name}': no {k}");
    let min = e.min.ok_or_else(|| what("Min"))?;
    let max = e.max.ok_or_else(|| what("Max"))?;
    if !(min.is_finite() && max.is_finite() && min <= max) {
        return Err(format!(
            "entry '{name}': Min {min} and Max {max} are not a finite range"
        ));
    }
    let counts = e.counts.unwrap_or_default();
    if counts.is_empty() {
        return Err(format!("entry '{name}': an empty Histogram"));
    }
    let mut h = Histogram::new(min, max, counts.len());
    h.counts = counts;
    out.push((name, h));
    Ok(())
}

/// Parses a profile; the error names the line or entry.
pub fn parse(text: &str) -> Result<Profile, String> {
    let mut version: Option<String> = None;
    let mut hash: Option<String> = None;
    let mut entries: Vec<(String, Histogram)> = Vec::new();
    let mut cur: Option<Entry> = None;
    for (k, raw) in text.lines().enumerate() {
        let line_no = k + 1;
        let line = strip_comment(raw).trim_end();
        let t = line.trim();
        if t.is_empty() || t == "---" || t == "..." || t == "[]" {
            continue;
        }
        // A block-list item of counts.
        if let Some(e) = cur.as_mut()
            && e.in_block
        {
            if let Some(item) = t.strip_prefix("- ")
                && line.starts_with("  ")
                && !item.contains(':')
            {
                let counts = e.counts.get_or_insert_with(Vec::new);
                if counts.len() >= MAX_BINS {
                    return Err(format!("line {line_no}: more than {MAX_BINS} histogram bins"));
                }
                counts.push(parse_count(item, line_no)?);
                continue;
            }
            e.in_block = false;
        }
        let (body, new_entry) = match t.strip_prefix("- ") {
            Some(rest) if !line.starts_with(' ') => (rest.trim(), true),
            _ => (t, false),
        };
        if new_entry {
            if let Some(e) = cur.take() {
                finish(e, &mut entries)?;
            }
            cur = Some(Entry::default());
        }
        let Some((key, value)) = body.split_once(':') else {
            return Err(format!("line {line_no}: expected 'key: value', got '{t}'"));
        };
        let (key, value) = (key.trim(), value.trim());
        match (key, cur.as_mut()) {
            ("GlowToolsVersion", None) => version = Some(unquote(value)),
            ("GraphPreLowerHash", None) => hash = Some(unquote(value)),
            ("NodeOutputName", Some(e)) => e.name = Some(unquote(value)),
            ("Min" | "Max", Some(e)) => {
                let v: f32 = unquote(value)
                    .parse()
                    .map_err(|_| format!("line {line_no}: {key} '{value}' is not a number"))?;
                if key == "Min" {
                    e.min = Some(v);
                } else {
                    e.max = Some(v);
                }
            }
            ("Histogram", Some(e)) => {
                if value.is_empty() {
                    e.in_block = true;
                    e.counts = Some(Vec::new());
                } else {
                    e.counts = Some(parse_counts(value, line_no)?);
                }
            }
            (k, _) => return Err(format!("line {line_no}: unexpected key '{k}'")),
        }
    }
    if let Some(e) = cur.take() {
        finish(e, &mut entries)?;
    }
    Ok(Profile {
        version: version.ok_or("no GlowToolsVersion document")?,
        hash: hash.ok_or("no GraphPreLowerHash document")?,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Profile {
        let mut h = Histogram::new(-1.25, 6.5, 4);
        h.counts = vec![0, 3, 17, 2];
        let mut g = Histogram::new(0.0, 0.1, 2);
        g.counts = vec![5, 0];
        Profile {
            version: "kiln 0.1.0".into(),
            hash: "abc123".into(),
            entries: vec![("conv1's out".into(), h), ("x".into(), g)],
        }
    }

    #[test]
    fn write_then_parse_gives_the_profile_and_the_same_bytes() {
        let p = sample();
        let text = write(&p);
        let back = parse(&text).unwrap();
        assert_eq!(back, p);
        assert_eq!(write(&back), text);
    }

    #[test]
    fn block_lists_comments_and_quotes_are_read() {
        let text = "---\nGlowToolsVersion: \"glow 1\"\n---\nGraphPreLowerHash: h # the hash\n---\n\
                    - NodeOutputName: a\n  Min: -1\n  Max: 1.5\n  Histogram:\n  - 1\n  - 2.0\n  - 3\n\
                    - NodeOutputName: 'b'\n  Min: 0\n  Max: 2\n  Histogram: [4]\n";
        let p = parse(text).unwrap();
        assert_eq!(p.version, "glow 1");
        assert_eq!(p.hash, "h");
        assert_eq!(p.entries.len(), 2);
        assert_eq!(p.entries[0].0, "a");
        assert_eq!(p.entries[0].1.counts, vec![1, 2, 3]);
        assert_eq!((p.entries[0].1.min, p.entries[0].1.max), (-1.0, 1.5));
        assert_eq!(p.entries[1].1.counts, vec![4]);
    }

    #[test]
    fn bad_profiles_name_what_is_wrong() {
        let e = parse("---\nGraphPreLowerHash: h\n").unwrap_err();
        assert!(e.contains("GlowToolsVersion"), "{e}");
        let e = parse("GlowToolsVersion: v\nGraphPreLowerHash: h\n- NodeOutputName: a\n  Min: x\n").unwrap_err();
        assert!(e.contains("line 4") && e.contains("Min"), "{e}");
        let e = parse(
            "GlowToolsVersion: v\nGraphPreLowerHash: h\n- NodeOutputName: a\n  Min: 2\n  Max: 1\n  Histogram: [1]\n",
        )
        .unwrap_err();
        assert!(e.contains("'a'") && e.contains("range"), "{e}");
        let e = parse("GlowToolsVersion: v\nGraphPreLowerHash: h\n- NodeOutputName: a\n  Min: 0\n  Max: 1\n  Histogram: [1, -2]\n")
            .unwrap_err();
        assert!(e.contains("-2"), "{e}");
        let e = parse("GlowToolsVersion: v\nGraphPreLowerHash: h\n- Min: 0\n").unwrap_err();
        assert!(e.contains("NodeOutputName"), "{e}");
    }
}
