//! `kiln repro BUNDLE`: replays an error artifact (`save_error_artifact`, see
//! `kiln::artifact`): compiles its model with its configuration, and for a failed run runs it
//! on its inputs (first the failing node alone, when the bundle has it), and says whether the
//! recorded error came back.

use anyhow::{Context, Result, bail};
use kiln::artifact::{BundleInfo, Stage, read_info};
use kiln::{Session, SessionOptions};
use kiln_cli::npy;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ReproArgs {
    /// The bundle directory an error message named.
    bundle: PathBuf,
}

/// What a replay ended in.
enum Outcome {
    Same(String),
    Different(String),
    Passed,
}

pub fn repro(a: ReproArgs) -> Result<ExitCode> {
    let dir = &a.bundle;
    let info = read_info(dir).map_err(anyhow::Error::msg)?;
    let config_path = dir.join(&info.config);
    let text =
        std::fs::read_to_string(&config_path).with_context(|| format!("cannot read {}", config_path.display()))?;
    let config: kiln_config::Config = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a kiln configuration", config_path.display()))?;
    let mut options = SessionOptions::from_config(&config);
    options.artifacts = None;
    let Some(model) = &info.model else {
        bail!("the bundle has no model (it could not be saved when the error happened)");
    };
    let model = dir.join(model);
    println!(
        "bundle   {} (kiln {}, {} failure{})",
        dir.display(),
        info.kiln_version,
        match info.stage {
            Stage::Compile => "compile",
            Stage::Run => "run",
        },
        if info.randomized_weights {
            "; weights randomized"
        } else {
            ""
        }
    );
    println!("recorded {}", info.error);
    if let (Some(node_model), Some(node_inputs)) = (&info.node_model, &info.node_inputs) {
        let outcome = replay(&dir.join(node_model), Some(&dir.join(node_inputs)), &options);
        let node = info.node.as_deref().unwrap_or("?");
        match outcome {
            Ok(()) => println!("node     '{node}' alone on its captured inputs: runs without error"),
            Err(e) => println!("node     '{node}' alone on its captured inputs: {e}"),
        }
    }
    let inputs = info.inputs.as_ref().map(|i| dir.join(i));
    let outcome = match replay(&model, inputs.as_deref(), &options) {
        Ok(()) => Outcome::Passed,
        Err(e) => {
            let got = normalise(&e, &model, &info);
            if got == normalise(&info.error, &model, &info) {
                Outcome::Same(e)
            } else {
                Outcome::Different(e)
            }
        }
    };
    Ok(match outcome {
        Outcome::Same(e) => {
            println!("replayed {e}");
            println!("reproduced: the same error");
            ExitCode::from(1)
        }
        Outcome::Different(e) => {
            println!("replayed {e}");
            println!("not reproduced: a different error");
            ExitCode::from(2)
        }
        Outcome::Passed => {
            println!("not reproduced: it runs without error here");
            ExitCode::SUCCESS
        }
    })
}

/// The error text with the bundle's model path and the original one made the same.
fn normalise(e: &str, model: &Path, info: &BundleInfo) -> String {
    let mut s = e.replace(&model.display().to_string(), "MODEL");
    if let Some(src) = &info.source_path {
        s = s.replace(src.as_str(), "MODEL");
    }
    s
}

/// Opens the model and, given inputs, runs it once: the error as printed, if any.
fn replay(model: &Path, inputs: Option<&Path>, options: &SessionOptions) -> Result<(), String> {
    let chain = |e: &kiln::Error| kiln::artifact::chain(e);
    let session = Session::new(model, options).map_err(|e| chain(&e))?;
    let Some(inputs) = inputs else { return Ok(()) };
    let feed: Vec<(String, kiln::Value)> = npy::read_npz(inputs)
        .map_err(|e| format!("{e:#}"))?
        .into_iter()
        .map(|(n, t)| (n, kiln::Value::Tensor(t)))
        .collect();
    session.run(feed).map(|_| ()).map_err(|e| chain(&e))
}
