//! qaic's custom I/O options on a model about to be compiled: `dump_custom_io_config_template_file`
//! writes the model's inputs and outputs as a template, `custom_io_list_file` takes them in
//! another precision or layout (`kiln_config::load_custom_io` reads the file,
//! `kiln_compiler::custom_io` edits the graph).

use crate::session::{Error, SessionOptions};
use kiln_compiler::custom_io::{IoPrecision, IoSpec};
use kiln_onnx::Model;

/// `model` with the custom I/O of `options` applied (the template written first, of the
/// model as it came); the model itself when neither option is set.
pub(crate) fn apply(model: Model, options: &SessionOptions) -> Result<Model, Error> {
    let c = &options.config.compile;
    if let Some(path) = &c.dump_custom_io_config_template_file {
        let g = &model.graph;
        let rank = |v: kiln_ir::ValueId| {
            g.value(v)
                .and_then(|x| x.ty.tensor())
                .and_then(|t| t.shape.as_ref())
                .map(Vec::len)
        };
        let io: Vec<(String, &'static str, Option<usize>)> = g
            .inputs
            .iter()
            .map(|&v| (g.value_name(v).to_string(), "input", rank(v)))
            .chain(
                g.outputs
                    .iter()
                    .map(|&v| (g.value_name(v).to_string(), "output", rank(v))),
            )
            .collect();
        std::fs::write(path, kiln_config::custom_io_template(&io)).map_err(|e| Error::Unsupported {
            path: path.display().to_string(),
            reason: format!("cannot write the custom I/O template: {e}"),
        })?;
    }
    let Some(path) = &c.custom_io_list_file else {
        return Ok(model);
    };
    let entries = kiln_config::load_custom_io(path).map_err(|e| Error::Unsupported {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    let specs: Vec<IoSpec> = entries
        .iter()
        .map(|e| IoSpec {
            name: e.name.clone(),
            nhwc: e.layout == Some(kiln_config::IoLayout::Nhwc),
            precision: match e.precision {
                None | Some(kiln_config::IoPrecision::Float) => IoPrecision::Float,
                Some(kiln_config::IoPrecision::Float16) => IoPrecision::Float16,
                Some(kiln_config::IoPrecision::Uint8) => IoPrecision::Quantized {
                    dtype: kiln_tensor::DType::U8,
                    scale: e.scale.unwrap_or(1.0),
                    zero_point: e.offset.unwrap_or(0),
                },
                Some(kiln_config::IoPrecision::Int8) => IoPrecision::Quantized {
                    dtype: kiln_tensor::DType::I8,
                    scale: e.scale.unwrap_or(1.0),
                    zero_point: e.offset.unwrap_or(0),
                },
            },
        })
        .collect();
    let mut model = model;
    kiln_compiler::custom_io::apply(&mut model.graph, &specs)?;
    model.graph.verify().map_err(|e| Error::Unsupported {
        path: path.display().to_string(),
        reason: format!("the graph with custom I/O does not verify: {e}"),
    })?;
    Ok(model)
}
