//! Invalid configuration files and arguments: each gives one precise error naming the option,
//! the value, what is allowed and file:line:column; none panics.

#![allow(clippy::panic)]

use kiln_config::{Config, ConfigError};
use std::path::Path;

fn error(text: &str, name: &str) -> String {
    let mut c = Config::default();
    match c.load_str(text, Path::new(name)).and_then(|()| c.validate()) {
        Ok(()) => panic!("{name}: {text:?} loaded"),
        Err(e) => e.to_string(),
    }
}

fn override_error(arg: &str) -> String {
    match Config::default().apply_override(arg) {
        Ok(()) => panic!("{arg} accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unknown_keys_name_the_closest_option() {
    assert_eq!(
        error("num_activations: 1\naic_num_core: 4\n", "o.yaml"),
        "o.yaml:2:1: unknown option 'aic_num_core'; did you mean 'aic_num_cores'?"
    );
    assert_eq!(
        error("{\n  \"optimisation_type\": 3\n}", "o.json"),
        "o.json:2:3: unknown option 'optimisation_type'; did you mean 'optimization_type'?"
    );
    assert_eq!(
        error("graph_custom_configs:\n  - name: g\n    vtcm_mbb: 8\n", "o.yaml"),
        "o.yaml:3:5: unknown option 'vtcm_mbb'; did you mean 'vtcm_mb'?"
    );
    assert_eq!(
        error("frobnicate: 1\n", "o.yaml"),
        "o.yaml:1:1: unknown option 'frobnicate'; `kiln config list` shows every option"
    );
    assert_eq!(
        error("id: 1\n", "o.yaml"),
        "o.yaml:1:1: 'id' is ambiguous here: it is device_id in HtpDeviceConfig and core_id in HtpDeviceCoreConfig"
    );
}

#[test]
fn wrong_types_name_the_option_value_and_type() {
    assert_eq!(
        error("convert_to_fp16: maybe\n", "o.yaml"),
        "o.yaml:1:18: invalid value \"maybe\" for convert_to_fp16: expected true or false"
    );
    assert_eq!(
        error("onnx_define_symbol: [1, 2]\n", "o.yaml"),
        "o.yaml:1:21: invalid value [1,2] for onnx_define_symbol: expected a mapping of symbol names to non-negative integers (e.g. {batch: 1})"
    );
    assert_eq!(
        error("aic_num_cores: \"4\"\n", "o.yaml"),
        "o.yaml:1:16: invalid value \"4\" for num_of_cores: expected an integer >= 1"
    );
}

#[test]
fn out_of_range_values_name_the_range() {
    for (text, want) in [
        (
            "O: 5\n",
            "o.yaml:1:4: invalid value 5 for optimization_type: expected an integer in 0..=3",
        ),
        (
            "percentile_calibration_value: 89.5\n",
            "o.yaml:1:31: invalid value 89.5 for percentile_calibration_value: expected a number in [90, 100]",
        ),
        (
            "aic_depth_first_mem: 64\n",
            "o.yaml:1:22: invalid value 64 for aic_depth_first_mem: expected null or an integer in 8..=32",
        ),
        (
            "size_split_granularity: 256\n",
            "o.yaml:1:25: invalid value 256 for size_split_granularity: expected an integer in 512..=2048",
        ),
        (
            "vtcm_working_set_limit_ratio: 0\n",
            "o.yaml:1:31: invalid value 0 for vtcm_working_set_limit_ratio: expected a number in (0, 1]",
        ),
        (
            "mvm_utilization_limit: 0.1\n",
            "o.yaml:1:24: invalid value 0.1 for mvm_utilization_limit: expected a number in [0.125, 1]",
        ),
        (
            "pmu_recipe_opt: AxiAll\n",
            "o.yaml:1:17: invalid value \"AxiAll\" for pmu_recipe_opt: expected one of AxiRd, AxiWr, AxiRdWr, KernelUtil, HmxMacs",
        ),
    ] {
        assert_eq!(error(text, "o.yaml"), want);
    }
    // Inside a backend-extension file, at the value's own position.
    assert_eq!(
        error("{\"graphs\": [{\"graph_names\": [\"g\"], \"O\": 7}]}", "be.json"),
        "be.json:1:41: invalid value 7 for optimization_type: expected an integer in 0..=3"
    );
}

#[test]
fn malformed_files_give_the_parser_position() {
    assert_eq!(
        error("a: 1\n  b: 2\n", "bad.yaml"),
        "bad.yaml:2:4: malformed YAML: mapping values are not allowed in this context"
    );
    assert_eq!(
        error("O: 1\nO: 2\n", "dup.yaml"),
        "dup.yaml:2:1: malformed YAML: duplicate mapping key: O, set DuplicateKeyPolicy in Options if acceptable"
    );
    assert_eq!(
        error("{\"O\": 1,}", "bad.json"),
        "bad.json:1:9: malformed JSON: trailing comma"
    );
    assert_eq!(
        error("{\"O\": 1", "bad.json"),
        "bad.json:1:7: malformed JSON: EOF while parsing an object"
    );
    assert_eq!(
        error("- O: 1\n", "list.yaml"),
        "list.yaml:1:1: expected a mapping of option names to values, found a list"
    );
    assert_eq!(
        error("graphs: {O: 1}\nO: 2\n", "o.yaml"),
        "o.yaml:1:9: expected a list of mappings for 'graphs', found a mapping"
    );
}

#[test]
fn one_option_twice_through_aliases_is_an_error() {
    assert_eq!(
        error("O: 1\noptimization_type: 2\n", "o.yaml"),
        "o.yaml:2:1: optimization_type is set twice in one mapping (first as 'O', then as 'optimization_type')"
    );
}

#[test]
fn exclusive_options_conflict() {
    let e = error("enable_metrics: true\nenable_profiling: true\n", "o.yaml");
    assert_eq!(
        e,
        "enable_metrics (o.yaml:1:1) and enable_profiling (o.yaml:2:1) \
cannot be used together: profiling already reports the metrics (qaic allows one of them)"
    );
    let e = error("enable_intermediate_outputs: true\nset_output_tensors: a\n", "o.yaml");
    assert!(e.starts_with("enable_intermediate_outputs (o.yaml:1:1"), "{e}");
    let e = error("group_id: 2\nmax_spill_fill_buffer_for_group: 10\n", "o.yaml");
    assert!(e.ends_with("max_spill_fill_buffer_for_group needs group_id 0"), "{e}");
}

#[test]
fn bad_overrides_say_what_is_wrong() {
    assert_eq!(override_error("O"), "bad override 'O': expected KEY=VALUE");
    assert_eq!(override_error("=3"), "bad override '=3': the key is empty");
    assert_eq!(
        override_error("O=9"),
        "command line: invalid value 9 for optimization_type: expected an integer in 0..=3"
    );
    assert_eq!(
        override_error("num_of_core=2"),
        "command line: unknown option 'num_of_core'; did you mean 'num_of_cores'?"
    );
    assert_eq!(
        override_error("graphs=[]"),
        "bad override 'graphs=[]': graphs is a group of options; set them one by one"
    );
    assert_eq!(
        override_error("onnx_define_symbol.batch=-1"),
        "command line: invalid value -1 for onnx_define_symbol: expected a non-negative integer"
    );
}

#[test]
fn overrides_read_values_as_yaml() {
    let mut c = Config::default();
    for arg in [
        "O=0",
        "onnx_define_symbol={batch: 2, seq: 8}",
        "onnx_define_symbol.n=3",
        "set_output_tensors=a,b",
        "output_dir=out/x",
        "enable_profiling=true",
        "inf_time=2.5",
    ] {
        c.apply_override(arg).unwrap_or_else(|e| panic!("{arg}: {e}"));
    }
    assert_eq!(c.compile.optimization_type, 0);
    let symbols: Vec<(&str, u64)> = c
        .compile
        .onnx_define_symbol
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    assert_eq!(symbols, vec![("batch", 2), ("n", 3), ("seq", 8)]);
    assert_eq!(c.compile.output_tensors, vec!["a".to_string(), "b".to_string()]);
    assert_eq!(c.compile.output_dir.as_deref(), Some(Path::new("out/x")));
    assert!(c.runtime.enable_profiling);
    assert_eq!(c.runtime.inf_time, Some(2.5));
}

#[test]
fn unimplemented_options_are_refused_together() {
    let mut c = Config::default();
    c.load_str(
        "convert_to_fp16: true\nmxfp6_matmul_weights: true\nO: 1\n",
        Path::new("q.yaml"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    match c.check() {
        Err(ConfigError::NotImplemented { options }) => {
            let names: Vec<&str> = options.iter().map(|u| u.option.as_str()).collect();
            assert_eq!(names, vec!["convert_to_fp16", "mxfp6_matmul_weights"]);
        }
        other => panic!("{other:?}"),
    }
    // Set to kiln's own default, an unimplemented option is harmless and silent.
    let mut c = Config::default();
    c.load_str(
        "convert_to_fp16: false\nquantization_calibration: None\n",
        Path::new("q.yaml"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.check().map(|w| w.len()).ok(), Some(0));
}

#[test]
fn quantization_options_need_something_that_quantizes() {
    let mut c = Config::default();
    c.load_str("quantization_calibration: Percentile\n", Path::new("q.yaml"))
        .unwrap_or_else(|e| panic!("{e}"));
    let e = c.check().unwrap_err().to_string();
    assert!(
        e.contains("quantization_calibration") && e.contains("convert_to_quantize"),
        "{e}"
    );
    let mut c = Config::default();
    c.load_str(
        "convert_to_quantize: true\nquantization_calibration: Percentile\nenable_channelwise: true\n",
        Path::new("q.yaml"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.check().map(|w| w.len()).ok(), Some(0));
    let mut c = Config::default();
    c.load_str("dump_profile: a.yaml\nload_profile: b.yaml\n", Path::new("q.yaml"))
        .unwrap_or_else(|e| panic!("{e}"));
    let e = c.check().unwrap_err().to_string();
    assert!(e.contains("dump_profile") && e.contains("load_profile"), "{e}");
}

/// No prefix of a valid file, and no byte flipped in one, makes loading panic.
#[test]
fn truncated_and_mangled_files_never_panic() {
    let yaml = "aic_num_cores: 4\nonnx_define_symbol:\n  batch: 1\ngraphs:\n  - name: g\n    O: 3\n    vtcm_mb: 8\n\
devices:\n  - dsp_arch: v73\n    cores: [{core_id: 0, perf_profile: burst}]\noutput_dir: './x'\n";
    let json =
        "{\"graphs\": [{\"graph_names\": [\"g\"], \"O\": 3.0}], \"devices\": [{\"cores\": [{\"id\": 0}]}], \"x\": {}}";
    for (text, name) in [(yaml, "f.yaml"), (json, "f.json"), (json, "f.yaml")] {
        let bytes = text.as_bytes();
        for cut in 0..=bytes.len() {
            if let Ok(s) = std::str::from_utf8(&bytes[..cut]) {
                let _ = Config::default().load_str(s, Path::new(name));
            }
        }
        for i in 0..bytes.len() {
            for b in [b'[', b'{', b':', b'-', b'"', b'\n', b' ', b'9', b'&', b'*'] {
                let mut m = bytes.to_vec();
                m[i] = b;
                if let Ok(s) = std::str::from_utf8(&m) {
                    let _ = Config::default().load_str(s, Path::new(name));
                }
            }
        }
    }
    for arg in [
        "=",
        "O=",
        "O=[",
        "O={",
        "x.y.z=1",
        "onnx_define_symbol.=1",
        "onnx_define_symbol.a=[1]",
        "O=&a",
    ] {
        let _ = Config::default().apply_override(arg);
    }
}

#[test]
fn axelera_quantization_options_are_checked() {
    let check = |yaml: &str| {
        let mut c = Config::default();
        c.load_str(yaml, Path::new("a.yaml")).unwrap_or_else(|e| panic!("{e}"));
        c.check().map(|_| ()).map_err(|e| e.to_string())
    };
    assert!(check("compiler_mode: quantize_and_lower\nquantization_scheme: per_tensor_min_max\n").is_ok());
    let e = check("quantization_scheme: per_tensor_min_max\n").unwrap_err();
    assert!(e.contains("quantize_and_lower"), "{e}");
    let e = check(
        "compiler_mode: quantize_and_lower\nquantization_scheme: per_tensor_min_max\nquantization_calibration: MSE\n",
    )
    .unwrap_err();
    assert!(e.contains("per_tensor_min_max"), "{e}");
    let e = check("compiler_mode: quantize_only\n").unwrap_err();
    assert!(e.contains("quantize_only") && e.contains("not yet implemented"), "{e}");
    let e = check("load_profile: p.yaml\nexternal_quantization_file: r.json\n").unwrap_err();
    assert!(e.contains("external_quantization_file"), "{e}");
}
