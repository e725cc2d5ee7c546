//! HTP backend-extension files: import with alias mapping, unknown fields kept as extras, the
//! passthrough mode, and export back: unchanged after a plain import, patched after an override.

#![allow(clippy::panic)]

use kiln_config::{Config, Source, WarningKind};
use serde_json::Value;
use std::path::Path;

/// A backend-extension file as `HtpConfigHelper` / `json.dumps(indent=4)` writes it, with an
/// unknown field in a section, an unknown top-level section and two graph configs.
const BE: &str = r#"{
    "graphs": [
        {
            "graph_names": [
                "encoder"
            ],
            "O": 3.0,
            "vtcm_mb": 8,
            "fp16_relaxed_precision": 0,
            "hvx_threads": 4,
            "enable_graph_switching": true
        },
        {
            "graph_names": [
                "decoder"
            ],
            "O": 1,
            "dlbc": 1
        }
    ],
    "devices": [
        {
            "device_id": 0,
            "soc_model": 69,
            "dsp_arch": "v75",
            "pd_session": "unsigned",
            "cores": [
                {
                    "core_id": 0,
                    "perf_profile": "burst",
                    "rpc_control_latency": 100
                }
            ]
        }
    ],
    "context": {
        "weight_sharing_enabled": true,
        "max_spill_fill_buffer_for_group": 0,
        "group_id": 0
    },
    "memory": {
        "mem_type": "shared_buffer"
    },
    "groupContext": {
        "share_resources": true
    },
    "vendor_notes": {
        "owner": "perf-team",
        "weights": [
            1.5,
            -2,
            null
        ]
    }
}
"#;

fn import(text: &str, name: &str) -> Config {
    let mut c = Config::default();
    c.load_str(text, Path::new(name)).unwrap_or_else(|e| panic!("{e}"));
    c
}

#[test]
fn import_maps_aliases_and_keeps_extras() {
    let c = import(BE, "be.json");
    assert_eq!(c.compile.optimization_type, 3);
    assert_eq!(c.compile.vtcm_size_in_mb, 8);
    assert_eq!(c.compile.hvx_threads, 4);
    assert_eq!(c.compile.graph_names, vec!["encoder".to_string()]);
    assert_eq!(c.compile.soc_model, 69);
    assert_eq!(c.compile.perf_profile, kiln_config::PerfProfile::Burst);
    assert!(c.compile.weight_sharing_enabled && c.compile.share_resources);
    assert!(c.compile.dlbc, "the second graph's own options still apply");
    match c.source("vtcm_size_in_mb") {
        Source::File { at, key } => assert_eq!((at.line, at.column, key.as_str()), (8, 13, "vtcm_mb")),
        other => panic!("{other:?}"),
    }
    let w: Vec<(WarningKind, String)> = c.warnings().into_iter().map(|w| (w.kind, w.option)).collect();
    assert!(
        w.contains(&(WarningKind::KeptExtra, "enable_graph_switching".into())),
        "{w:?}"
    );
    assert!(w.contains(&(WarningKind::KeptExtra, "vendor_notes".into())), "{w:?}");
    assert!(
        w.contains(&(WarningKind::GraphConflict, "optimization_type".into())),
        "{w:?}"
    );
    assert!(w.contains(&(WarningKind::NoEffect, "vtcm_size_in_mb".into())), "{w:?}");
    assert!(c.check().is_ok());
}

#[test]
fn import_then_export_is_byte_identical() {
    let c = import(BE, "be.json");
    assert_eq!(c.to_backend_extension_json(), BE);
}

#[test]
fn other_layouts_round_trip_as_json() {
    let compact: Value = serde_json::from_str(BE).unwrap_or_default();
    let text = serde_json::to_string(&compact).unwrap_or_default();
    let c = import(&text, "be.json");
    let back: Value = serde_json::from_str(&c.to_backend_extension_json()).unwrap_or_default();
    assert_eq!(back, compact);
}

#[test]
fn the_round_trip_survives_storage_in_a_program() {
    let c = import(BE, "be.json");
    let stored = serde_json::to_string(&c).unwrap_or_default();
    let back: Config = serde_json::from_str(&stored).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back.to_backend_extension_json(), BE);
}

#[test]
fn overrides_are_written_back_in_the_file_spelling() {
    let mut c = import(BE, "be.json");
    c.apply_override("vtcm_size_in_mb=4").unwrap_or_else(|e| panic!("{e}"));
    c.apply_override("fp16_relaxed_precision=true")
        .unwrap_or_else(|e| panic!("{e}"));
    let out: Value = serde_json::from_str(&c.to_backend_extension_json()).unwrap_or_default();
    assert_eq!(out["graphs"][0]["vtcm_mb"], 4);
    assert_eq!(out["graphs"][0]["fp16_relaxed_precision"], 1);
    assert_eq!(out["graphs"][0]["O"], 3.0, "untouched values keep their written form");
    assert_eq!(out["graphs"][1]["O"], 1, "the second graph keeps its own value");
    assert_eq!(out["vendor_notes"]["owner"], "perf-team");
}

#[test]
fn passthrough_keeps_the_file_without_validating_it() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let f = dir.path().join("be.json");
    let odd = BE.replace("\"O\": 1,", "\"O\": 99,");
    std::fs::write(&f, &odd).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Config::default();
    assert!(
        c.load_backend_extensions(&f, false).is_err(),
        "O 99 is out of range when mapped"
    );
    let mut c2 = Config::default();
    c2.load_backend_extensions(&f, true).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c2.to_backend_extension_json(), odd);
    assert_eq!(c2.compile, kiln_config::CompileConfig::default(), "nothing is applied");
    assert_eq!(c2.warnings().first().map(|w| w.kind), Some(WarningKind::Passthrough));
}

#[test]
fn export_without_an_imported_file_uses_the_htp_spellings() {
    let mut c = Config::default();
    for arg in [
        "O=3",
        "vtcm_size_in_mb=8",
        "graph_names=g",
        "perf_profile=BURST",
        "core_id=1",
        "share_resources=true",
    ] {
        c.apply_override(arg).unwrap_or_else(|e| panic!("{e}"));
    }
    let expected = "{\n    \"graphs\": [\n        {\n            \"O\": 3,\n            \"graph_names\": [\n                \"g\"\n            ],\n            \"vtcm_mb\": 8\n        }\n    ],\n    \"devices\": [\n        {\n            \"cores\": [\n                {\n                    \"core_id\": 1\n                }\n            ]\n        }\n    ],\n    \"groupContext\": {\n        \"share_resources\": true\n    }\n}\n";
    assert_eq!(c.to_backend_extension_json(), expected);
    assert_eq!(c.compile.perf_profile, kiln_config::PerfProfile::Burst);
}
