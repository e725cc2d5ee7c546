//! The JSON Schema (draft 2020-12) of a configuration file, generated from the registry: every
//! option under its name and each alias, with its type, range or choices, default, status on
//! this target and meaning; and the backend-extension sections with the options they hold.

use crate::registry::{self, CONTAINERS, OptionSpec, Scope};
use serde_json::{Map, Value, json};

/// The schema of a kiln configuration file.
pub fn schema() -> schemars::Schema {
    let mut defs = Map::new();
    for spec in registry::options() {
        defs.insert(spec.name.to_string(), option_schema(spec));
    }
    let mut props = Map::new();
    for spec in registry::options() {
        props.insert(spec.name.to_string(), json!({"$ref": format!("#/$defs/{}", spec.name)}));
        for alias in spec.aliases() {
            if alias_is_unique(alias) {
                props.insert(
                    alias.to_string(),
                    json!({"$ref": format!("#/$defs/{}", spec.name), "description": format!("Alias of {}.", spec.name)}),
                );
            }
        }
    }
    for scope in [
        Scope::HtpContext,
        Scope::HtpGraph,
        Scope::HtpDevice,
        Scope::HtpCore,
        Scope::HtpMemory,
        Scope::HtpGroupContext,
    ] {
        defs.insert(section_def(scope).to_string(), section_schema(scope));
    }
    for c in CONTAINERS {
        let item = match c.scope {
            Scope::Top => json!({"$ref": "#"}),
            s => json!({"$ref": format!("#/$defs/{}", section_def(s))}),
        };
        let s = if c.list {
            json!({"type": "array", "items": item, "description": c.help})
        } else if c.name == "context" {
            json!({"anyOf": [item, {"type": "array", "items": item}], "description": c.help})
        } else {
            let mut m = item;
            if let Value::Object(o) = &mut m {
                o.insert("description".into(), json!(c.help));
            }
            m
        };
        if c.scope == Scope::HtpCore {
            continue; // only inside a device config
        }
        props.insert(c.name.to_string(), s.clone());
        for alias in c.aliases() {
            props.insert(alias.to_string(), s.clone());
        }
    }
    let v = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "kiln configuration",
        "description": "Options of kiln, the ahead-of-time ONNX compiler and CPU runtime, under their own names and the spellings of qaic, QAIRT (AIC and HTP) and Axelera. Each option's description gives its status on this target. AIC backend-extension keys may carry the prefixes compiler_ and runtime_. Backend-extension files additionally keep unknown fields as extras.",
        "type": "object",
        "properties": props,
        "patternProperties": {"^(compiler|runtime)_": {"description": "AicConfigHelper backend-extension key: an AicCompilerConfig / AicRuntimeConfig field with its prefix."}},
        "additionalProperties": false,
        "$defs": defs,
    });
    schemars::Schema::try_from(v).unwrap_or_default()
}

fn alias_is_unique(alias: &str) -> bool {
    registry::options()
        .iter()
        .filter(|s| s.origins.iter().any(|o| o.key == alias) || s.name == alias)
        .count()
        == 1
}

fn section_def(scope: Scope) -> &'static str {
    match scope {
        Scope::Top => "top",
        Scope::HtpContext => "htp_context",
        Scope::HtpGraph => "htp_graph",
        Scope::HtpDevice => "htp_device",
        Scope::HtpCore => "htp_core",
        Scope::HtpMemory => "htp_memory",
        Scope::HtpGroupContext => "htp_group_context",
    }
}

fn section_schema(scope: Scope) -> Value {
    let mut props = Map::new();
    for spec in registry::options() {
        let keys: Vec<&str> = spec
            .origins
            .iter()
            .filter(|o| o.doc.htp_scope() == Some(scope))
            .map(|o| o.key)
            .collect();
        if keys.is_empty() {
            continue;
        }
        props.insert(spec.name.to_string(), json!({"$ref": format!("#/$defs/{}", spec.name)}));
        for k in keys {
            props.insert(k.to_string(), json!({"$ref": format!("#/$defs/{}", spec.name)}));
        }
    }
    if scope == Scope::HtpDevice {
        props.insert(
            "cores".into(),
            json!({"type": "array", "items": {"$ref": format!("#/$defs/{}", section_def(Scope::HtpCore))}}),
        );
    }
    json!({"type": "object", "properties": props, "additionalProperties": false})
}

fn option_schema(spec: &OptionSpec) -> Value {
    let mut s = match spec.kind.schema() {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    let note = spec.status.note();
    let status = if note.is_empty() {
        spec.status.label().to_string()
    } else {
        format!("{}: {note}", spec.status.label())
    };
    s.insert("description".into(), json!(format!("{} [{status}]", spec.help)));
    s.insert("default".into(), spec.default_value());
    Value::Object(s)
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_choices_are_in_the_schema() {
        let s = schema().to_value();
        assert_eq!(s["$schema"], "https://json-schema.org/draft/2020-12/schema");
        let d = &s["$defs"];
        assert_eq!(
            (
                d["optimization_type"]["minimum"].as_i64(),
                d["optimization_type"]["maximum"].as_i64()
            ),
            (Some(0), Some(3))
        );
        assert_eq!(d["percentile_calibration_value"]["minimum"], 90.0);
        assert_eq!(d["vtcm_working_set_limit_ratio"]["exclusiveMinimum"], 0.0);
        assert_eq!(d["pmu_recipe_opt"]["enum"][0], "AxiRd");
        assert_eq!(s["properties"]["O"]["$ref"], "#/$defs/optimization_type");
        assert_eq!(
            d["htp_graph"]["properties"]["vtcm_mb"]["$ref"],
            "#/$defs/vtcm_size_in_mb"
        );
        assert!(
            s["properties"].get("id").is_none(),
            "ambiguous aliases only inside their section"
        );
    }
}
