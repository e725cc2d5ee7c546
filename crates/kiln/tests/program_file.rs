//! The Session API over a compiled program: same results as the ONNX model, shared by many
//! threads with identical results, qaic-style shape dicts, setup.

use kiln::{DType, Dim, Session, SessionOptions, Tensor, Value, compile_file};
use std::path::Path;

fn example() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/tiny_cnn.onnx")
}

fn input(seed: u32) -> Vec<(String, Value)> {
    // A simple deterministic pattern in [-1, 1).
    let v: Vec<f32> = (0..3 * 32 * 32)
        .map(|i| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) % 2000) as f32 / 1000.0 - 1.0)
        .collect();
    vec![(
        "image".into(),
        Value::Tensor(Tensor::from_vec(vec![1, 3, 32, 32], v).unwrap()),
    )]
}

fn probs(out: &[(String, Value)]) -> Vec<f32> {
    out[0].1.as_tensor().unwrap().as_slice::<f32>().unwrap().to_vec()
}

#[test]
fn program_file_session_matches_the_onnx_session_across_threads() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tiny.kiln");
    let options = SessionOptions::default();
    let summary = compile_file(&example(), &file, &options).unwrap();
    assert!(summary.file_bytes > 0 && summary.file_bytes % 64 == 0);
    let onnx = Session::new(example(), &options).unwrap();
    let program = Session::new(&file, &SessionOptions::default()).unwrap();
    let meta = program.program_meta().unwrap();
    assert_eq!(meta.content_hash, summary.meta.content_hash);
    assert!(onnx.program_meta().is_none());
    assert!(program.setup() > 0, "setup touches the mapped weights");

    let want: Vec<Vec<f32>> = (0..8).map(|s| probs(&onnx.run(input(s)).unwrap())).collect();
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (program, want) = (&program, &want);
            scope.spawn(move || {
                for round in 0..8 {
                    let s = (t + round) % 8;
                    assert_eq!(
                        probs(&program.run(input(s as u32)).unwrap()),
                        want[s],
                        "thread {t} seed {s}"
                    );
                }
            });
        }
    });
}

#[test]
fn shape_dicts_name_every_input_and_output() {
    let s = Session::new(example(), &SessionOptions::default()).unwrap();
    let ins = s.model_input_shape_dict();
    let image = &ins["image"];
    assert_eq!(image.dtype, Some(DType::F32));
    assert_eq!(
        image.shape,
        Some(vec![Dim::Fixed(1), Dim::Fixed(3), Dim::Fixed(32), Dim::Fixed(32)])
    );
    let outs = s.model_output_shape_dict();
    assert_eq!(outs.keys().collect::<Vec<_>>(), ["probs"]);
    assert_eq!(outs["probs"].shape, Some(vec![Dim::Fixed(1), Dim::Fixed(10)]));
}

#[test]
fn reset_forgets_metrics() {
    let options = SessionOptions {
        enable_metrics: true,
        ..SessionOptions::default()
    };
    let s = Session::new(example(), &options).unwrap();
    assert!(s.get_metrics().is_none(), "no run yet");
    s.run(input(1)).unwrap();
    assert!(s.get_metrics().is_some());
    s.reset();
    assert!(s.get_metrics().is_none(), "reset forgets the recorded runs");
    s.run(input(2)).unwrap();
    assert!(s.get_metrics().is_some());
}

/// `num_of_cores = 3`: the same results as one thread (every split is by whole rows, panels or
/// planes), and between runs the workers sleep: the process uses (almost) no CPU while idle.
#[test]
fn threads_give_the_same_results_and_sleep_between_runs() {
    let one = Session::new(example(), &SessionOptions::default()).unwrap();
    let three = Session::new(
        example(),
        &SessionOptions {
            threads: 3,
            ..SessionOptions::default()
        },
    )
    .unwrap();
    assert_eq!((one.threads(), three.threads()), (1, 3));
    for s in 0..4 {
        assert_eq!(probs(&one.run(input(s)).unwrap()), probs(&three.run(input(s)).unwrap()));
    }
    #[cfg(target_os = "linux")]
    {
        // utime + stime of the pool's worker threads, in clock ticks (fields 14 and 15 of
        // /proc/self/task/TID/stat); other tests of this binary run on other threads.
        let worker_ticks = || -> (usize, u64) {
            let mut n = 0;
            let mut ticks = 0;
            for task in std::fs::read_dir("/proc/self/task").unwrap() {
                let dir = task.unwrap().path();
                let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
                if !comm.starts_with("kiln-worker") {
                    continue;
                }
                let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
                let after_name = &stat[stat.rfind(')').unwrap() + 2..];
                let f: Vec<&str> = after_name.split_whitespace().collect();
                ticks += f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
                n += 1;
            }
            (n, ticks)
        };
        // A new thread names itself when it first runs: on a loaded machine the workers may
        // not have been scheduled yet (the caller can run every task of a small model itself).
        // Wait for their names, up to 10 s.
        let mut waited = 0;
        while worker_ticks().0 < 2 && waited < 1000 {
            std::thread::sleep(std::time::Duration::from_millis(10));
            waited += 1;
        }
        let (workers, before) = worker_ticks();
        assert!(workers >= 2, "{workers} worker threads");
        std::thread::sleep(std::time::Duration::from_millis(500));
        let idle = worker_ticks().1 - before;
        // Two spinning workers would burn ~100 ticks (2 x 0.5 s at 100 Hz); sleeping ones none.
        assert!(idle <= 5, "{idle} ticks of worker CPU while idle");
    }
}
