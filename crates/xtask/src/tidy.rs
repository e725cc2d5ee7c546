//! The tidy checks.

use std::path::{Path, PathBuf};

/// Allowed internal dependencies per crate: dependencies point up the layer table in
/// ARCHITECTURE.md. A crate not listed here is a tidy failure until it is added on purpose.
pub const ALLOWED: &[(&str, &[&str])] = &[
    ("kiln-kernels", &[]),
    ("kiln-tensor", &["kiln-kernels"]),
    ("kiln-ops", &["kiln-tensor", "kiln-kernels"]),
    ("kiln-ir", &["kiln-tensor", "kiln-ops"]),
    ("kiln-onnx", &["kiln-tensor", "kiln-ops", "kiln-ir"]),
    ("kiln-config", &[]),
    (
        "kiln-runtime",
        &["kiln-tensor", "kiln-kernels", "kiln-ops", "kiln-config"],
    ),
    (
        "kiln-compiler",
        &[
            "kiln-tensor",
            "kiln-kernels",
            "kiln-ops",
            "kiln-ir",
            "kiln-runtime",
            "kiln-config",
        ],
    ),
    (
        "kiln",
        &[
            "kiln-tensor",
            "kiln-ops",
            "kiln-ir",
            "kiln-onnx",
            "kiln-runtime",
            "kiln-compiler",
            "kiln-config",
        ],
    ),
    ("kiln-cli", &["kiln", "kiln-config"]),
    ("kiln-python", &["kiln", "kiln-config"]),
    ("kiln-conformance", &["kiln"]),
    ("xtask", &[]),
];

/// Files allowed to contain `unsafe`: the kernels crate, the memory-mapping loaders, and the
/// Python bindings' view of numpy buffers (bytes owned elsewhere, like a memory map).
pub const UNSAFE_ALLOWED: &[&str] = &[
    "crates/kiln-kernels/",
    "crates/kiln-python/src/buffer.rs",
    "crates/kiln-onnx/src/mmap.rs",
    "crates/kiln-runtime/src/file/mmap.rs",
];

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn run_all(root: &Path) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    problems.extend(check_dependencies(root));
    problems.extend(check_sources(root));
    if problems.is_empty() { Ok(()) } else { Err(problems) }
}

fn crate_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.join("Cargo.toml").exists())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// Every internal dependency of every crate must be in its allowed list.
pub fn check_dependencies(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for dir in crate_dirs(root) {
        let manifest = dir.join("Cargo.toml");
        let text = match std::fs::read_to_string(&manifest) {
            Ok(t) => t,
            Err(e) => {
                problems.push(format!("{}: {e}", manifest.display()));
                continue;
            }
        };
        let doc: toml::Table = match text.parse() {
            Ok(d) => d,
            Err(e) => {
                problems.push(format!("{}: {e}", manifest.display()));
                continue;
            }
        };
        let name = doc
            .get("package")
            .and_then(|p| p.get("name"))
            .and_then(|n| n.as_str())
            .unwrap_or("?")
            .to_string();
        let Some((_, allowed)) = ALLOWED.iter().find(|(n, _)| *n == name) else {
            problems.push(format!(
                "crate '{name}' is not in the dependency table (xtask/src/tidy.rs and ARCHITECTURE.md)"
            ));
            continue;
        };
        for section in ["dependencies", "build-dependencies"] {
            let Some(deps) = doc.get(section).and_then(|d| d.as_table()) else {
                continue;
            };
            for dep in deps.keys() {
                let internal = dep.starts_with("kiln") || dep == "xtask";
                if internal && !allowed.contains(&dep.as_str()) {
                    problems.push(format!("crate '{name}' depends on '{dep}', which the layering forbids"));
                }
            }
        }
    }
    problems
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.filter_map(|e| e.ok()) {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "target") {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every source file opens with a `//!` line; `unsafe` appears only where allowed, and every
/// `unsafe` block or impl says why it is sound in a `// SAFETY` comment (see
/// [`unjustified_unsafe`]).
pub fn check_sources(root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    for f in files {
        let rel = f.strip_prefix(root).unwrap_or(&f).to_string_lossy().replace('\\', "/");
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        if !text.trim_start().starts_with("//!") {
            problems.push(format!("{rel}: does not open with a `//!` line saying what it is for"));
        }
        let uses_unsafe = text.lines().any(|l| {
            let code = strip_strings(l.split("//").next().unwrap_or(""));
            code.match_indices("unsafe").any(|(i, _)| {
                let before = code[..i]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
                let after = code[i + 6..].chars().next().is_none_or(|c| c == ' ' || c == '{');
                before && after
            })
        });
        if uses_unsafe && !UNSAFE_ALLOWED.iter().any(|a| rel.contains(a)) {
            problems.push(format!(
                "{rel}: uses unsafe outside the kernels crate and the mmap loader"
            ));
        }
        for line in unjustified_unsafe(&text) {
            problems.push(format!(
                "{rel}:{line}: an unsafe block without a `// SAFETY:` comment saying why it is sound"
            ));
        }
    }
    problems
}

/// How far above an `unsafe` block its `SAFETY` comment may stand when code lies between
/// (a comment covering a short group of calls).
const SAFETY_REACH: usize = 6;

/// The 1-based lines of `text` that open an `unsafe` block (`unsafe {`) or `unsafe impl`
/// with no `SAFETY` comment on the line itself, in the unbroken run of comment and attribute
/// lines directly above it, or within [`SAFETY_REACH`] lines above it.
pub fn unjustified_unsafe(text: &str) -> Vec<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = strip_strings(line.split("//").next().unwrap_or(""));
        let opens = code.match_indices("unsafe").any(|(at, _)| {
            let before = code[..at]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
            let rest = code[at + 6..].trim_start();
            before && (rest.starts_with('{') || rest.starts_with("impl"))
        });
        if !opens || line.contains("SAFETY") {
            continue;
        }
        let near = lines[i.saturating_sub(SAFETY_REACH)..i]
            .iter()
            .any(|l| l.contains("SAFETY"));
        let above = lines[..i]
            .iter()
            .rev()
            .map(|l| l.trim_start())
            .take_while(|l| l.starts_with("//") || l.starts_with("#["))
            .any(|l| l.contains("SAFETY"));
        if !(near || above) {
            out.push(i + 1);
        }
    }
    out
}

/// The line with the contents of its string literals removed.
fn strip_strings(line: &str) -> String {
    let mut out = String::new();
    let mut in_str = false;
    let mut prev = ' ';
    for c in line.chars() {
        if c == '"' && prev != '\\' {
            in_str = !in_str;
        } else if !in_str {
            out.push(c);
        }
        prev = c;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crate_dependencies_point_up_the_layers() {
        let problems = check_dependencies(&workspace_root());
        assert!(problems.is_empty(), "{problems:#?}");
    }

    #[test]
    fn sources_have_headers_and_fenced_unsafe() {
        let problems = check_sources(&workspace_root());
        assert!(problems.is_empty(), "{problems:#?}");
    }

    #[test]
    fn unsafe_blocks_need_a_safety_comment() {
        let text = "//! x\nfn f(p: *const u8) -> u8 {\n    unsafe { *p }\n}\n";
        assert_eq!(unjustified_unsafe(text), [3]);
        let ok = "//! x\nfn f(p: *const u8) -> u8 {\n    // SAFETY: p is valid.\n    unsafe { *p }\n}\n";
        assert!(unjustified_unsafe(ok).is_empty());
        let long = format!(
            "// SAFETY: the run of comments above the block\n{}unsafe impl Send for X {{}}\n",
            "// more\n".repeat(10)
        );
        assert!(unjustified_unsafe(&long).is_empty());
        let far = format!(
            "// SAFETY: too far, with code between\n{}unsafe {{ g() }}\n",
            "x();\n".repeat(7)
        );
        assert_eq!(unjustified_unsafe(&far), [9]);
        assert!(unjustified_unsafe("unsafe fn g() {}\nlet s = \"unsafe {\";\n").is_empty());
    }

    #[test]
    fn a_forbidden_dependency_is_caught() {
        let dir = std::env::temp_dir().join(format!("kiln-tidy-{}", std::process::id()));
        let c = dir.join("crates/kiln-runtime");
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(
            c.join("Cargo.toml"),
            "[package]\nname = \"kiln-runtime\"\n[dependencies]\nkiln-ir = { path = \"../kiln-ir\" }\n",
        )
        .unwrap();
        let problems = check_dependencies(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("kiln-ir"));
    }
}
