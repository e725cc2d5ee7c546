//! `kiln config list|show|schema` end to end: the registry as users see it, the resolved
//! configuration with its sources, and precise errors for bad files and overrides.

#![allow(clippy::panic)]

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run kiln: {e}"))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap_or_else(|e| panic!("{e}"));
    p.to_string_lossy().into_owned()
}

#[test]
fn list_json_has_every_option_with_aliases_and_status() {
    let o = kiln(&["config", "list", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{e}"));
    let items = v.as_array().cloned().unwrap_or_default();
    assert_eq!(
        items.len(),
        kiln_config::options().len() + kiln_config::CONTAINERS.len()
    );
    let find = |name: &str| items.iter().find(|i| i["name"] == name).cloned().unwrap_or(Value::Null);
    let o = find("optimization_type");
    assert_eq!(o["status"], "implemented");
    assert_eq!(o["default"], 2);
    assert_eq!(o["allowed"], "0..=3");
    assert!(o["aliases"].as_array().is_some_and(|a| a.contains(&Value::from("O"))));
    let n = find("num_of_cores");
    assert_eq!(n["status"], "implemented");
    assert_eq!(find("perf_warnings")["status"], "not_yet_implemented_warning");
    assert!(
        n["aliases"]
            .as_array()
            .is_some_and(|a| a.contains(&Value::from("aic_num_cores")))
    );
    let d = find("do_ddr_to_multicast");
    assert_eq!(d["status"], "no_effect");
    assert!(d["status_note"].as_str().is_some_and(|s| s.contains("DDR")));
    assert_eq!(find("convert_to_fp16")["status"], "not_yet_implemented_error");
    assert_eq!(
        find("pmu_recipe_opt")["allowed"],
        "AxiRd | AxiWr | AxiRdWr | KernelUtil | HmxMacs"
    );
}

#[test]
fn list_text_names_each_option_once() {
    let o = kiln(&["config", "list"]);
    assert!(o.status.success());
    let text = stdout(&o);
    assert!(
        text.lines()
            .any(|l| l.starts_with("vtcm_size_in_mb ") && l.contains("(also vtcm_mb")),
        "{text}"
    );
}

#[test]
fn show_prints_values_and_where_they_came_from() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let f = write(
        dir.path(),
        "options.yaml",
        "aic_num_cores: 4\nnum_activations: 1\nconvert_to_fp16: true\nonnx_define_symbol:\n  batch: 1\noutput_dir: './resnet_qpc'\naic_perf_warnings: true\n",
    );
    let o = kiln(&[
        "config",
        "show",
        "--config",
        &f,
        "-O",
        "O=3",
        "-O",
        "onnx_define_symbol.seq=128",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let line = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_default()
            .to_string()
    };
    assert!(line("optimization_type").contains("3") && line("optimization_type").contains("command line (-O O=3)"));
    assert!(
        line("num_of_cores").contains(&format!("{f}:1:1 (as aic_num_cores)")),
        "{out}"
    );
    assert!(line("onnx_define_symbol").contains(r#"{"batch":1,"seq":128}"#), "{out}");
    assert!(line("enable_profiling").contains("default"), "{out}");
    let err = stderr(&o);
    assert!(err.contains("warning: perf_warnings is not yet implemented"), "{err}");
    assert!(!err.contains("num_of_cores is not yet implemented"), "{err}");
    assert!(
        err.contains("note: compile and run would refuse this configuration"),
        "{err}"
    );
    assert!(err.contains("convert_to_fp16 = true"), "{err}");
}

#[test]
fn show_json_and_backend_extensions() {
    let o = kiln(&["config", "show", "--json", "-O", "vtcm_mb=8"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v["options"]["vtcm_size_in_mb"]["value"], 8);
    assert_eq!(v["options"]["vtcm_size_in_mb"]["source"]["from"], "command_line");
    assert_eq!(v["warnings"][0]["kind"], "no_effect");
    let o = kiln(&["config", "show", "--backend-extensions", "-O", "vtcm_mb=8"]);
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v, serde_json::json!({"graphs": [{"vtcm_mb": 8}]}));
}

#[test]
fn schema_is_draft_2020_12_with_every_option() {
    let o = kiln(&["config", "schema"]);
    assert!(o.status.success());
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v["$schema"], "https://json-schema.org/draft/2020-12/schema");
    for s in kiln_config::options() {
        assert!(v["properties"].get(s.name).is_some(), "{}", s.name);
    }
    assert_eq!(v["$defs"]["aic_depth_first_mem"]["anyOf"][0]["maximum"], 32);
}

#[test]
fn bad_files_and_overrides_fail_with_one_precise_error() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let f = write(dir.path(), "bad.yaml", "num_activations: 1\naic_num_core: 4\n");
    let o = kiln(&["config", "show", "--config", &f]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o).trim(),
        format!("error: {f}:2:1: unknown option 'aic_num_core'; did you mean 'aic_num_cores'?")
    );
    let f = write(dir.path(), "range.yaml", "size_split_granularity: 4096\n");
    let o = kiln(&["config", "show", "--config", &f]);
    assert_eq!(
        stderr(&o).trim(),
        format!("error: {f}:1:25: invalid value 4096 for size_split_granularity: expected an integer in 512..=2048")
    );
    let f = write(dir.path(), "broken.yaml", "a: [1, 2\n");
    let o = kiln(&["config", "show", "--config", &f]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).starts_with(&format!("error: {f}:")), "{}", stderr(&o));
    assert!(stderr(&o).contains("malformed YAML"), "{}", stderr(&o));
    let o = kiln(&[
        "config",
        "show",
        "-O",
        "enable_metrics=true",
        "-O",
        "enable_profiling=yes",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("cannot be used together"), "{}", stderr(&o));
}
