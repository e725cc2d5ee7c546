//! The seed documents against the registry: every option name they define (checked-in test
//! data, `tests/data/seed-option-names.txt`) is known (as a name or an alias) with a status,
//! and each of their own examples loads with the values it says.

#![allow(clippy::panic)]

use kiln_config::{Config, ConfigError, Source, WarningKind};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::Path;

fn load(text: &str, name: &str) -> Config {
    let mut c = Config::default();
    c.load_str(text, Path::new(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    c.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
    c
}

/// Names listed by `kiln config list --json`: every name and alias.
fn listed() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for o in kiln_config::list_json().as_array().into_iter().flatten() {
        assert!(o["status"].as_str().is_some_and(|s| !s.is_empty()), "{o} has no status");
        out.insert(o["name"].as_str().unwrap_or_default().to_string());
        for a in o["aliases"].as_array().into_iter().flatten() {
            out.insert(a.as_str().unwrap_or_default().to_string());
        }
    }
    out
}

/// The option names of each seed document (`tests/data/seed-option-names.txt`, written from
/// `../shared/seeds` by `scripts/seed_option_names.py`): `(document, declared count, names)`.
fn seed_names() -> Vec<(String, usize, Vec<String>)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/seed-option-names.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut docs: Vec<(String, usize, Vec<String>)> = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        if let Some(head) = line.strip_prefix('[') {
            let (file, rest) = head.split_once(']').unwrap_or_else(|| panic!("bad header {line:?}"));
            let count = rest.rsplit(": ").next().and_then(|n| n.trim().parse().ok());
            let count = count.unwrap_or_else(|| panic!("no count in {line:?}"));
            docs.push((file.to_string(), count, Vec::new()));
        } else if let Some(doc) = docs.last_mut() {
            doc.2.push(line.trim().to_string());
        } else {
            panic!("a name before the first document header: {line:?}");
        }
    }
    docs
}

#[test]
fn every_option_name_of_the_seed_documents_is_known() {
    let known = listed();
    let docs = seed_names();
    let files: Vec<&str> = docs.iter().map(|d| d.0.as_str()).collect();
    assert_eq!(
        files,
        [
            "000_e6bbef448403fff0.txt", // AicCompilerConfig 37 + AicRuntimeConfig 5
            "001_087bbcb7e8fe419d.txt", // CompileConfig attributes
            "002_2363c1b869467d47.txt", // HTP context / device / core / graph / group / memory
            "003_d65661a908b58012.txt", // qaic keyword arguments
            "004_e306b2e5cbb1ee9e.txt", // Axelera CompilerConfig
        ]
    );
    let mut total = 0;
    for (file, count, names) in &docs {
        assert_eq!(names.len(), *count, "{file}: {names:?}");
        let missing: Vec<&String> = names.iter().filter(|n| !known.contains(n.as_str())).collect();
        assert!(missing.is_empty(), "{file}: unknown to `kiln config list`: {missing:?}");
        total += names.len();
    }
    assert_eq!(total, 255, "the seed documents define 255 option names (with repeats)");
}

#[test]
fn names_not_in_field_lists_are_known_too() {
    let known = listed();
    // set_weight_sharing keywords, set_mode, the HTP JSON spellings, run_benchmark arguments.
    for n in [
        "mode",
        "graph_names",
        "soc_model",
        "dsp_arch",
        "hvx_threads",
        "vtcm_size_in_mb",
        "fp16",
        "vtcm_mb",
        "O",
        "device_id",
        "core_id",
        "id",
        "name",
        "num_inferences",
        "inf_time",
        "graphs",
        "devices",
        "cores",
        "context",
        "memory",
        "groupContext",
        "graph_custom_configs",
        "device_custom_configs",
        "context_custom_configs",
        "memory_custom_config",
        "group_context_config",
        "compiler_custom_configs",
    ] {
        assert!(known.contains(n), "{n}");
    }
}

#[test]
fn aliases_work_both_ways() {
    for (alias, name, value) in [
        ("vtcm_mb", "vtcm_size_in_mb", "8"),
        ("O", "optimization_type", "3"),
        ("aic_num_cores", "num_of_cores", "4"),
        ("num_cores", "num_of_cores", "4"),
        ("mos", "max_out_channel_split", "2"),
        ("ols", "overlap_split_factor", "3"),
        ("io_crc", "gen_crc", "true"),
        ("io_crc_stride", "crc_stride", "64"),
        ("multicast_weights", "do_ddr_to_multicast", "false"),
        ("stats_batchsize", "stats_batch_size", "4"),
        ("aic_pmu_recipe", "pmu_recipe_opt", "AxiRd"),
        ("set_output_tensors", "output_tensors", "a,b"),
    ] {
        let mut by_alias = Config::default();
        by_alias
            .apply_override(&format!("{alias}={value}"))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut by_name = Config::default();
        by_name
            .apply_override(&format!("{name}={value}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(by_alias.get(name), by_name.get(name), "{alias}");
        assert_eq!(by_alias.get(alias), by_name.get(name), "{alias}");
        assert_ne!(
            by_alias.get(name),
            kiln_config::option(name).map(|s| s.default_value()),
            "{alias}"
        );
    }
}

#[test]
fn qaic_options_yaml_example_loads() {
    let text = "aic_num_cores: 4\nnum_activations: 1\nconvert_to_fp16: true\nonnx_define_symbol:\n  batch: 1\noutput_dir: './resnet_qpc'\n";
    let c = load(text, "options.yaml");
    assert_eq!(c.runtime.num_of_cores, 4);
    assert_eq!(c.runtime.num_activations, 1);
    assert!(c.compile.convert_to_fp16);
    assert_eq!(c.compile.onnx_define_symbol.get("batch"), Some(&1));
    assert_eq!(c.compile.output_dir.as_deref(), Some(Path::new("./resnet_qpc")));
    match c.source("aic_num_cores") {
        Source::File { at, key } => {
            assert_eq!((at.line, at.column, key.as_str()), (1, 1, "aic_num_cores"));
            assert_eq!(at.file, Path::new("options.yaml"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(c.source("optimization_type"), Source::Default);
    // num_of_cores is implemented (the thread pool): nothing to warn about here.
    let w = c.warnings();
    assert!(w.is_empty(), "{w:?}");
    let perf = load("aic_perf_warnings: true\n", "options.yaml");
    let w = perf.warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(
        (w[0].kind, w[0].option.as_str()),
        (WarningKind::NotYetImplemented, "perf_warnings")
    );
    // fp16 is refused where it would change results, naming the option and where it was set.
    let e = c.check().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        e.contains("convert_to_fp16 = true (options.yaml:3:1): fp16 execution is not yet implemented"),
        "{e}"
    );
}

#[test]
fn qaic_keyword_example_via_set() {
    let mut c = Config::default();
    c.set(
        "num_activations",
        &json!(4),
        Source::CommandLine {
            arg: "num_activations=4".into(),
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    c.set("set_size", &json!(10), Source::Default)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((c.runtime.num_activations, c.runtime.set_size), (4, 10));
}

#[test]
fn compile_config_example_with_a_graph_config_loads() {
    let text = "backend: HTP\nsoc_details: \"chipset:SM8550\"\ngraph_custom_configs:\n  - name: graph_A\n    optimization_type: 3\n";
    let c = load(text, "compile.yaml");
    assert_eq!(c.compile.optimization_type, 3);
    assert_eq!(c.compile.graph_names, vec!["graph_A".to_string()]);
    assert_eq!(c.compile.soc_details.as_deref(), Some("chipset:SM8550"));
    let kinds: Vec<(String, WarningKind)> = c.warnings().into_iter().map(|w| (w.option, w.kind)).collect();
    assert!(kinds.contains(&("backend".into(), WarningKind::NoEffect)), "{kinds:?}");
    assert!(
        kinds.contains(&("soc_details".into(), WarningKind::NoEffect)),
        "{kinds:?}"
    );
    assert!(c.check().is_ok());
}

#[test]
fn weight_sharing_mode_loads_and_exports() {
    let text = "backend: HTP\nsoc_details: \"chipset:SM8650\"\nmode: weight_sharing\ngraph_names: [graph_A, graph_B]\n\
soc_model: 57\ndsp_arch: v75\nhvx_threads: 4\nvtcm_size_in_mb: 8\n";
    let c = load(text, "ws.yaml");
    assert!(c.compile.weight_sharing_enabled);
    assert_eq!(
        c.source("weight_sharing_enabled"),
        Source::Implied {
            by: "mode weight_sharing".into()
        }
    );
    assert_eq!(c.compile.vtcm_size_in_mb, 8);
    let exported: Value = serde_json::from_str(&c.to_backend_extension_json()).unwrap_or_default();
    assert_eq!(
        exported,
        json!({
            "context": {"weight_sharing_enabled": true},
            "graphs": [{"graph_names": ["graph_A", "graph_B"], "hvx_threads": 4, "vtcm_mb": 8}],
            "devices": [{"dsp_arch": "v75", "soc_model": 57}]
        })
    );
    // With fp16 the mode loads, but kiln refuses to run in a precision it does not implement.
    let c = load(&format!("{text}fp16: true\n"), "ws.yaml");
    assert!(c.compile.fp16_relaxed_precision);
    assert!(
        matches!(c.check(), Err(ConfigError::NotImplemented { options }) if options[0].option == "fp16_relaxed_precision")
    );
}

#[test]
fn aic_config_helper_dict_loads() {
    // AicConfigHelper.to_backend_extension_dict(AicCompilerConfig(graph_names=["graph1"])): the
    // AIC fields with their defaults, prefixed compiler_ / runtime_ as QNN's AIC backend reads them.
    let text = r#"{
    "graph_names": ["graph1"],
    "compiler_buffer_dealloc_delay": 2, "compiler_cluster_sizes": "1 2 0", "compiler_combine_inputs": true,
    "compiler_combine_outputs": true, "compiler_compilation_target": "hardware", "compiler_compile_threads": 2,
    "compiler_convert_to_FP16": true, "compiler_crc_stride": 256, "compiler_direct_api": true,
    "compiler_do_DDR_to_multicast": true, "compiler_do_host_preproc": true, "compiler_enable_debug": true,
    "compiler_enable_depth_first": true, "compiler_exclude_mxfp6_matmul": "", "compiler_force_VTCM_spill": true,
    "compiler_gen_crc": true, "compiler_hardware_version": "2.0", "compiler_max_out_channel_split": "1 2 0",
    "compiler_mdp_dump_partition_config": "mdp_pipeline_template.json",
    "compiler_mdp_load_partition_config": "mdp_config.json", "compiler_mxfp6_matmul_weights": false,
    "compiler_mxint8_mdp_io": false, "compiler_num_of_cores": 1, "compiler_overlap_split_factor": 2,
    "compiler_perf_warnings": true, "compiler_pmu_events": "1 2 0", "compiler_pmu_recipe_opt": "KernelUtil",
    "compiler_print_ddr_stats": true, "compiler_print_perf_metrics": true, "compiler_retained_state": false,
    "compiler_size_split_granularity": 1024, "compiler_stat_level": 10, "compiler_stats_batch_size": 2,
    "compiler_time_passes": true, "compiler_user_dma_producer_dma_enabled": true,
    "compiler_vtcm_working_set_limit_ratio": 1.0,
    "runtime_device_ids": [0], "runtime_num_activations": 1, "runtime_submit_num_retries": 5,
    "runtime_submit_timeout": 0, "runtime_threads_per_queue": 4
}"#;
    let c = load(text, "aic.json");
    assert_eq!(c.compile.graph_names, vec!["graph1".to_string()]);
    assert_eq!(c.compile.cluster_sizes, vec![1, 2, 0]);
    assert_eq!(c.compile.size_split_granularity, 1024);
    assert_eq!(c.runtime.device_ids, vec![0]);
    assert!(c.compile.gen_crc && c.compile.force_vtcm_spill && c.compile.do_ddr_to_multicast);
    let unsupported: Vec<String> = c.unsupported().into_iter().map(|u| u.option).collect();
    assert_eq!(unsupported, vec!["convert_to_fp16".to_string()]);
    let warned: Vec<String> = c.warnings().into_iter().map(|w| w.option).collect();
    assert!(!warned.iter().any(|w| w == "gen_crc"), "gen_crc works here: {warned:?}");
    for o in [
        "force_vtcm_spill",
        "enable_depth_first",
        "print_ddr_stats",
        "graph_names",
    ] {
        assert!(warned.iter().any(|w| w == o), "{o}: {warned:?}");
    }
}

#[test]
fn htp_config_helper_dict_loads_and_round_trips() {
    // HtpConfigHelper.to_backend_extension_dict([HtpContextConfig(weight_sharing_enabled=True)],
    //                                           [HtpGraphConfig(name="graph1")])
    let text = "{\n    \"context\": {\n        \"weight_sharing_enabled\": true\n    },\n    \"graphs\": [\n        {\n            \"graph_names\": [\n                \"graph1\"\n            ]\n        }\n    ]\n}\n";
    let c = load(text, "htp.json");
    assert!(c.compile.weight_sharing_enabled);
    assert_eq!(c.compile.graph_names, vec!["graph1".to_string()]);
    assert_eq!(c.to_backend_extension_json(), text);
}

#[test]
fn axelera_compiler_config_loads() {
    let text = r#"{
    "apply_pword_padding": true, "rewrite_concat_to_resadd": true, "output_dir": "build/yolo",
    "compiler_mode": "lower_only", "model_name": "yolov5s", "onnx_opset_version": 17,
    "quantization_scheme": "per_tensor_histogram", "tiling_depth": 6, "dfs_search_constraint": null,
    "io_memory_pool": "global.ddr", "l2_constraint": 8388608, "mvm_utilization_limit": 0.5,
    "icrx_max_factor": 4, "aipu_cores_used": 4, "resources_used": 0.25, "multicore_mode": "batch",
    "frequency": 400000000, "profiling_levels": ["[K]", "[M]"], "profiling_drop_percentile": 0.1,
    "softmax_neutral_value": -100000.0, "save_error_artifact": false
}"#;
    let c = load(text, "axelera.json");
    assert_eq!(c.compile.output_dir.as_deref(), Some(Path::new("build/yolo")));
    assert_eq!(c.compile.tiling_depth, 6);
    assert_eq!(c.compile.mvm_utilization_limit, 0.5);
    assert_eq!(c.compile.multicore_mode, kiln_config::MulticoreMode::Batch);
    assert_eq!(
        c.runtime.profiling_levels,
        vec![kiln_config::ProfilingLevel::K, kiln_config::ProfilingLevel::M]
    );
    assert!(c.check().is_ok());
    // Axelera's default mode quantizes (on calibration data); writing the quantized ONNX
    // file (quantize_only) is refused, not ignored.
    let c = load(r#"{"compiler_mode": "quantize_and_lower"}"#, "axelera.json");
    assert!(c.check().is_ok());
    let c = load(r#"{"compiler_mode": "quantize_only"}"#, "axelera.json");
    assert!(matches!(c.check(), Err(ConfigError::NotImplemented { .. })));
}

#[test]
fn from_file_reads_yaml_and_json_by_extension() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let y = dir.path().join("opts.yml");
    std::fs::write(&y, "O: 1\n").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(Config::from_file(&y).map(|c| c.compile.optimization_type).ok(), Some(1));
    let j = dir.path().join("opts.cfg");
    std::fs::write(&j, "{\"optimization_type\": 0}").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(Config::from_file(&j).map(|c| c.compile.optimization_type).ok(), Some(0));
    let missing = Config::from_file(dir.path().join("nope.yaml"))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        missing.starts_with("cannot read ") && missing.contains("nope.yaml"),
        "{missing}"
    );
}

#[test]
fn precedence_is_command_line_over_file_over_default() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let f = dir.path().join("o.yaml");
    std::fs::write(&f, "O: 1\nenable_profiling: true\n").unwrap_or_else(|e| panic!("{e}"));
    let c = Config::resolve(&[&f], &["optimization_type=3".to_string()]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.compile.optimization_type, 3);
    assert_eq!(
        c.source("O"),
        Source::CommandLine {
            arg: "optimization_type=3".into()
        }
    );
    assert!(c.runtime.enable_profiling);
    assert!(matches!(c.source("enable_profiling"), Source::File { at, .. } if at.line == 2));
    assert_eq!(c.runtime.num_of_cores, 1);
    assert_eq!(c.source("num_of_cores"), Source::Default);
}

#[test]
fn the_resolved_config_survives_json_storage() {
    let mut c = load(
        "O: 3\nonnx_define_symbol: {batch: 2}\nset_output_tensors: [a, b]\n",
        "s.yaml",
    );
    c.apply_override("enable_profiling=true")
        .unwrap_or_else(|e| panic!("{e}"));
    let stored = serde_json::to_string(&c).unwrap_or_default();
    let back: Config = serde_json::from_str(&stored).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back.compile, c.compile);
    assert_eq!(back.runtime, c.runtime);
    assert_eq!(back.sources, c.sources);
    assert_eq!(back.compile.output_tensors, vec!["a".to_string(), "b".to_string()]);
}
