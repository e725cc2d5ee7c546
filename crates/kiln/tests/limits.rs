//! Run limits and stopping: a Loop past its iteration limit, a run past its memory limit or
//! its time limit, a run cancelled from another thread, a compile past its time limit. Each
//! ends with an error naming the limit, the node and the figure, and the session keeps
//! working afterwards.

mod common;

use common::{Dim, F32, I64, import, model, node, value_info};
use kiln::raw::onnx::proto::{AttributeProto, GraphProto, attribute_proto::AttributeType};
use kiln::{Error, RunLimits, RunOptions, RuntimeError, Session, SessionOptions, Tensor, Value};
use std::time::Duration;

/// y = x + 1, M times: a Loop whose trip count is the input `m` (condition always true).
fn counting_loop() -> kiln::Model {
    counting_loop_of(1)
}

/// [`counting_loop`] over an `n`-element x.
fn counting_loop_of(n: i64) -> kiln::Model {
    let body = GraphProto {
        name: Some("body".into()),
        node: vec![
            node("Identity", "keep_going", &["cond_in"], &["cond_out"], vec![]),
            node("Add", "step", &["acc_in", "one"], &["acc_out"], vec![]),
        ],
        input: vec![
            value_info("iter", I64, &[]),
            value_info("cond_in", 9, &[]),
            value_info("acc_in", F32, &[Dim::N(n)]),
        ],
        output: vec![value_info("cond_out", 9, &[]), value_info("acc_out", F32, &[Dim::N(n)])],
        initializer: vec![kiln::raw::onnx::proto::TensorProto {
            name: Some("one".into()),
            data_type: Some(F32),
            dims: vec![1],
            float_data: vec![1.0],
            ..Default::default()
        }],
        ..Default::default()
    };
    let lp = node(
        "Loop",
        "the_loop",
        &["m", "cond", "x"],
        &["y"],
        vec![AttributeProto {
            name: Some("body".into()),
            r#type: Some(AttributeType::Graph as i32),
            g: Some(body),
            ..Default::default()
        }],
    );
    let m = model(
        vec![lp],
        vec![
            value_info("m", I64, &[]),
            value_info("cond", 9, &[]),
            value_info("x", F32, &[Dim::N(n)]),
        ],
        vec![value_info("y", F32, &[Dim::N(n)])],
        vec![],
    );
    import(&m).unwrap()
}

fn loop_inputs(m: i64) -> Vec<(String, Value)> {
    vec![
        ("m".into(), Value::Tensor(Tensor::scalar(m))),
        ("cond".into(), Value::Tensor(Tensor::scalar(true))),
        (
            "x".into(),
            Value::Tensor(Tensor::from_vec(vec![1], vec![0.0f32]).unwrap()),
        ),
    ]
}

fn y(out: &[(String, Value)]) -> f32 {
    match &out[0].1 {
        Value::Tensor(t) => t.to_f64_vec()[0] as f32,
        other => panic!("expected a tensor, got {other:?}"),
    }
}

fn session(model: &kiln::Model, limits: RunLimits) -> Session {
    let options = SessionOptions {
        limits,
        ..SessionOptions::default()
    };
    Session::from_model(model, &options).unwrap()
}

#[test]
fn a_loop_past_its_iteration_limit_is_refused_by_name_and_the_session_goes_on() {
    let s = session(
        &counting_loop(),
        RunLimits {
            loop_iterations: Some(1000),
            ..RunLimits::NONE
        },
    );
    assert_eq!(y(&s.run(loop_inputs(1000)).unwrap()), 1000.0);
    let err = s.run(loop_inputs(1 << 40)).unwrap_err();
    match &err {
        Error::Run(RuntimeError::LoopLimit {
            node,
            limit,
            trip_count,
        }) => {
            assert_eq!(node, "the_loop");
            assert_eq!(*limit, 1000);
            assert_eq!(*trip_count, Some(1 << 40));
        }
        other => panic!("expected a loop limit error, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("the_loop") && msg.contains("loop_iteration_limit"),
        "{msg}"
    );
    assert_eq!(y(&s.run(loop_inputs(7)).unwrap()), 7.0);
}

#[test]
fn a_run_cancelled_from_another_thread_ends_with_an_error_and_the_next_run_works() {
    // Without the cancel the loop would run 2^40 iterations; the iteration limit bounds the
    // test's time should cancellation not work.
    let s = session(
        &counting_loop(),
        RunLimits {
            loop_iterations: Some(200_000_000),
            ..RunLimits::NONE
        },
    );
    let options = RunOptions::new();
    let err = std::thread::scope(|scope| {
        let run = scope.spawn(|| s.run_with_options(loop_inputs(1 << 40), &options));
        std::thread::sleep(Duration::from_millis(30));
        options.terminate();
        run.join().unwrap().unwrap_err()
    });
    match &err {
        Error::Run(RuntimeError::Cancelled { node, .. }) => {
            // The stop is seen after a step of the loop's body (or the Loop itself).
            assert!(["keep_going", "step", "the_loop"].contains(&node.as_str()), "{node}");
        }
        other => panic!("expected a cancelled run, got {other}"),
    }
    // The flag stays set: later runs with these options end before their first node.
    let again = s.run_with_options(loop_inputs(3), &options).unwrap_err();
    assert!(again.to_string().contains("before the first node"), "{again}");
    options.unset_terminate();
    assert_eq!(y(&s.run_with_options(loop_inputs(3), &options).unwrap()), 3.0);
    assert_eq!(y(&s.run(loop_inputs(5)).unwrap()), 5.0);
}

#[test]
fn a_run_past_its_time_limit_names_the_limit() {
    let s = session(&counting_loop(), RunLimits::NONE);
    let options = RunOptions::new().with_time_limit(Duration::ZERO);
    let err = s.run_with_options(loop_inputs(10), &options).unwrap_err();
    match &err {
        Error::Run(RuntimeError::TimeLimit { limit_ms, .. }) => assert_eq!(*limit_ms, 0.0),
        other => panic!("expected a time limit error, got {other}"),
    }
    assert!(err.to_string().contains("run_time_limit_ms"), "{err}");
    // The session's own limit (none) applies to the next plain run.
    assert_eq!(y(&s.run(loop_inputs(10)).unwrap()), 10.0);

    // A session-wide limit from the options, the same way.
    let limited = session(
        &counting_loop(),
        RunLimits {
            time: Some(Duration::ZERO),
            ..RunLimits::NONE
        },
    );
    assert!(matches!(
        limited.run(loop_inputs(1)),
        Err(Error::Run(RuntimeError::TimeLimit { .. }))
    ));
}

/// y = Expand(x, shape): an output whose size only the run's inputs tell.
fn expand() -> kiln::Model {
    import(&expand_proto()).unwrap()
}

fn expand_proto() -> kiln::raw::onnx::proto::ModelProto {
    model(
        vec![node("Expand", "grow", &["x", "shape"], &["y"], vec![])],
        vec![
            value_info("x", F32, &[Dim::N(1)]),
            value_info("shape", I64, &[Dim::N(2)]),
        ],
        vec![value_info("y", F32, &[Dim::S("a"), Dim::S("b")])],
        vec![],
    )
}

fn expand_inputs(rows: i64, cols: i64) -> Vec<(String, Value)> {
    vec![
        (
            "x".into(),
            Value::Tensor(Tensor::from_vec(vec![1], vec![2.5f32]).unwrap()),
        ),
        (
            "shape".into(),
            Value::Tensor(Tensor::from_vec(vec![2], vec![rows, cols]).unwrap()),
        ),
    ]
}

#[test]
fn an_output_beyond_the_memory_limit_is_refused_before_it_is_allocated() {
    let s = session(
        &expand(),
        RunLimits {
            memory_bytes: Some(16 << 20),
            ..RunLimits::NONE
        },
    );
    let out = s.run(expand_inputs(512, 1024)).unwrap();
    assert_eq!(out[0].1.as_tensor().unwrap().shape(), &[512, 1024]);
    let err = s.run(expand_inputs(4096, 4096)).unwrap_err();
    match &err {
        Error::Run(RuntimeError::MemoryLimit {
            node,
            limit_bytes,
            needed_bytes,
            ..
        }) => {
            assert_eq!(node, "grow");
            assert_eq!(*limit_bytes, 16 << 20);
            assert_eq!(*needed_bytes, 4096 * 4096 * 4);
        }
        other => panic!("expected a memory limit error, got {other}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("64.0 MiB") && msg.contains("16.0 MiB") && msg.contains("run_memory_limit_mb"),
        "{msg}"
    );
    assert_eq!(s.run(expand_inputs(2, 3)).unwrap()[0].1.as_tensor().unwrap().len(), 6);
}

#[test]
fn the_default_limits_bound_memory_and_loops() {
    let d = RunLimits::default();
    assert_eq!(d.loop_iterations, Some(kiln::DEFAULT_LOOP_ITERATIONS));
    assert_eq!(d.time, None);
    // Three quarters of physical memory, where /proc/meminfo tells it.
    if let Some(bytes) = d.memory_bytes {
        assert!(bytes > 1 << 28, "{bytes}");
    }
    let c =
        kiln_config::Config::resolve::<&str>(&[], &["run_memory_limit_mb=64".into(), "run_time_limit_ms=250".into()])
            .unwrap();
    let o = SessionOptions::from_config(&c);
    assert_eq!(o.limits.memory_bytes, Some(64 << 20));
    assert_eq!(o.limits.time, Some(Duration::from_millis(250)));
}

#[test]
fn a_compile_past_its_time_limit_is_refused_and_names_the_limit() {
    let options = SessionOptions {
        compile_time_limit: Some(Duration::ZERO),
        ..SessionOptions::default()
    };
    let err = Session::from_model(&counting_loop(), &options).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("compile time limit") && msg.contains("compile_time_limit_s"),
        "{msg}"
    );
    // And a cancelled one.
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let options = SessionOptions {
        cancel: Some(flag),
        ..SessionOptions::default()
    };
    let msg = Session::from_model(&expand(), &options).unwrap_err().to_string();
    assert!(msg.contains("compile cancelled"), "{msg}");
}

#[test]
fn io_crc_sums_inputs_and_outputs_and_a_program_compiled_with_it_keeps_it() {
    let model = expand();
    let options = SessionOptions {
        io_crc: Some(4),
        limits: RunLimits::NONE,
        ..SessionOptions::default()
    };
    let s = Session::from_model(&model, &options).unwrap();
    assert_eq!(s.io_crc(), Some(4));
    let (out, crc) = s.run_with_crc(expand_inputs(2, 3), &RunOptions::default()).unwrap();
    assert_eq!(crc.stride, 4);
    let y = out[0].1.as_tensor().unwrap();
    assert_eq!(crc.outputs, vec![("y".to_string(), kiln::tensor_crc(y, 4))]);
    // Stride <= the sample: every byte, then the length.
    let mut bytes: Vec<u8> = std::iter::repeat_n(2.5f32.to_le_bytes(), 6).flatten().collect();
    bytes.extend_from_slice(&24u64.to_le_bytes());
    assert_eq!(crc.outputs[0].1, crc32fast::hash(&bytes));
    assert_eq!(crc.inputs.len(), 2);

    // gen_crc given to the compile stays with the program file.
    let dir = tempfile::tempdir().unwrap();
    let onnx = dir.path().join("expand.onnx");
    let prog = dir.path().join("expand.kiln");
    std::fs::write(&onnx, prost::Message::encode_to_vec(&expand_proto())).unwrap();
    let config = kiln_config::Config::resolve::<&str>(&[], &["gen_crc=true".into(), "crc_stride=16".into()]).unwrap();
    kiln::compile_file(&onnx, &prog, &SessionOptions::from_config(&config)).unwrap();
    let opened = Session::new(&prog, &SessionOptions::default()).unwrap();
    assert_eq!(opened.io_crc(), Some(16));
    let plain = Session::new(&onnx, &SessionOptions::default()).unwrap();
    assert_eq!(plain.io_crc(), None);
}

#[test]
fn a_long_loop_under_a_tight_memory_limit_holds_only_its_live_values() {
    // 2,000 iterations of a 4 KiB carried value: 8 MiB made in all, 8 KiB alive at a time.
    let s = session(
        &counting_loop_of(1024),
        RunLimits {
            memory_bytes: Some(1 << 20),
            ..RunLimits::NONE
        },
    );
    let feed = vec![
        ("m".into(), Value::Tensor(Tensor::scalar(2000i64))),
        ("cond".into(), Value::Tensor(Tensor::scalar(true))),
        (
            "x".into(),
            Value::Tensor(Tensor::from_vec(vec![1024], vec![0.0f32; 1024]).unwrap()),
        ),
    ];
    let out = s.run(feed).unwrap();
    let y = out[0].1.as_tensor().unwrap().to_f64_vec();
    assert!(y.iter().all(|&v| v == 2000.0));
}

/// The load_program fuzz target's finding (2026-11-26): the reference N-d pooling (3-D
/// windows take it) checked the run's time limit only between ops, so one MaxPool of 2^33
/// taps ran for minutes past a 2 s limit. It now answers the stop every 64Ki taps: this
/// run, hours of work without that, ends with the time limit's error.
#[test]
fn a_large_reference_pool_stops_at_the_time_limit() {
    let m = model(
        vec![node(
            "MaxPool",
            "pool",
            &["x"],
            &["y"],
            vec![
                common::ints("kernel_shape", &[33, 33, 33]),
                common::ints("pads", &[16, 16, 16, 16, 16, 16]),
            ],
        )],
        vec![value_info(
            "x",
            F32,
            &[Dim::N(1), Dim::N(1), Dim::N(64), Dim::N(64), Dim::N(64)],
        )],
        vec![value_info(
            "y",
            F32,
            &[Dim::N(1), Dim::N(1), Dim::N(64), Dim::N(64), Dim::N(64)],
        )],
        vec![],
    );
    let s = session(&import(&m).unwrap(), RunLimits::NONE);
    let feeds = s.with_random_inputs(Vec::new(), 3).unwrap();
    let options = RunOptions::new().with_time_limit(Duration::from_millis(100));
    match s.run_with_options(feeds, &options) {
        Err(Error::Run(RuntimeError::TimeLimit { node, .. })) => assert_eq!(node, "pool"),
        Err(other) => panic!("expected the time limit, got {other}"),
        Ok(_) => panic!("expected the time limit, the run finished"),
    }
}
