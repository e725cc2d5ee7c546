"""kiln's Python API: qaic's Session methods and return shapes, numpy in and out, errors,
threads and memory, checked against ONNX Runtime where there is a reference."""

import gc
import math
import os
import threading
import warnings

import numpy as np
import onnxruntime as ort
import pytest

import kiln


def ort_run(path, feeds):
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(None, feeds)))


# --- outputs against ONNX Runtime -------------------------------------------------------------


def test_run_matches_onnxruntime(example, example_input):
    s = kiln.Session(example)
    out = s.run({"image": example_input})
    ref = ort_run(example, {"image": example_input})
    assert list(out) == ["probs"]
    assert out["probs"].dtype == np.float32 and out["probs"].shape == (1, 10)
    np.testing.assert_allclose(out["probs"], ref["probs"], rtol=1e-5, atol=1e-6)


def test_mixed_dtypes_match_onnxruntime(models):
    rng = np.random.default_rng(1)
    feeds = {
        "a16": rng.standard_normal((3, 5)).astype(np.float16),
        "i": rng.integers(-100, 100, (3, 5)).astype(np.int32),
        "flag": rng.integers(0, 2, (3, 5)).astype(bool),
    }
    out = kiln.Session(models["mixed"]).run(feeds)
    ref = ort_run(models["mixed"], feeds)
    assert list(out) == ["sum16", "sq", "notflag", "as_float"]
    for name, r in ref.items():
        assert out[name].dtype == r.dtype, name
        np.testing.assert_array_equal(out[name], r, err_msg=name)


def test_every_dtype_round_trips(models):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(2)
    feeds = {
        "in_f16": rng.standard_normal((2, 3)).astype(np.float16),
        "in_f64": rng.standard_normal((2, 3)),
        "in_i8": np.array([[-128, 0, 127], [1, -1, 5]], np.int8),
        "in_i16": np.array([[-32768, 0, 32767], [1, -1, 5]], np.int16),
        "in_i32": np.array([[-(2**31), 0, 2**31 - 1], [1, -1, 5]], np.int32),
        "in_i64": np.array([[-(2**63), 0, 2**63 - 1], [1, -1, 5]], np.int64),
        "in_u8": np.array([[0, 255, 7], [1, 2, 3]], np.uint8),
        "in_u16": np.array([[0, 65535, 7], [1, 2, 3]], np.uint16),
        "in_u32": np.array([[0, 2**32 - 1, 7], [1, 2, 3]], np.uint32),
        "in_u64": np.array([[0, 2**64 - 1, 7], [1, 2, 3]], np.uint64),
        "in_b": np.array([[True, False, True], [False, False, True]]),
        "in_s": np.array([["a", "bc", ""], ["héllo", "x y", "z"]]),
        "in_bf16": np.array([[1.5, -2.0, 3.25], [0.0, 1e30, -7.0]], dtype=ml_dtypes.bfloat16),
    }
    out = kiln.Session(models["identity"]).run(feeds)
    for k, x in feeds.items():
        y = out["out_" + k[3:]]
        assert y.shape == x.shape, k
        if k == "in_s":
            assert y.dtype == object
            assert y.tolist() == x.tolist()
        else:
            assert y.dtype == x.dtype, k
            np.testing.assert_array_equal(y, x, err_msg=k)


def test_float8_and_int4_round_trip_through_ml_dtypes(models):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    feeds = {
        "in_f8": np.array([[0.5, -1.0, 448.0, 0.0], [1.75, -0.125, 3.0, 2.0]], dtype=ml_dtypes.float8_e4m3fn),
        "in_f8e5": np.array([[0.5, -1.0, 57344.0, 0.0], [1.5, -0.25, 3.0, 2.0]], dtype=ml_dtypes.float8_e5m2),
        "in_i4": np.array([[-8, -1, 0, 7], [1, 2, -3, 4]], dtype=ml_dtypes.int4),
        "in_u4": np.array([[0, 15, 7, 8], [1, 2, 3, 4]], dtype=ml_dtypes.uint4),
    }
    out = kiln.Session(models["identity_coded"]).run(feeds)
    for k, x in feeds.items():
        y = out["out_" + k[3:]]
        assert y.dtype == x.dtype, k
        np.testing.assert_array_equal(y.astype(np.float32), x.astype(np.float32), err_msg=k)


def test_object_and_bytes_string_inputs(models):
    s = kiln.Session(models["identity"])
    rng = np.random.default_rng(3)
    base = {k: v for k, v in _identity_feeds(rng).items()}
    base["in_s"] = np.array([[b"a", b"b", b"c"], [b"d", b"e", b"f"]])
    assert s.run(base)["out_s"].tolist() == [["a", "b", "c"], ["d", "e", "f"]]
    base["in_s"] = np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object)
    assert s.run(base)["out_s"].tolist() == [["a", "b", "c"], ["d", "e", "f"]]


def _identity_feeds(rng):
    import ml_dtypes

    f = {
        "in_f16": np.zeros((2, 3), np.float16),
        "in_f64": np.zeros((2, 3)),
        "in_b": np.zeros((2, 3), bool),
        "in_s": np.array([["a"] * 3] * 2),
        "in_bf16": np.zeros((2, 3), ml_dtypes.bfloat16),
    }
    for k in ["i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"]:
        f["in_" + k] = rng.integers(0, 100, (2, 3)).astype(np.dtype(k.replace("i", "int").replace("u", "uint")))
    return f


def test_layouts_are_accepted_and_give_the_same_result(example, example_input):
    s = kiln.Session(example)
    want = s.run({"image": example_input})["probs"]
    fortran = np.asfortranarray(example_input)
    big = np.zeros((1, 3, 32, 64), np.float32)
    big[..., ::2] = example_input
    strided = big[..., ::2]
    swapped = example_input.astype(example_input.dtype.newbyteorder(">"))
    listed = example_input.tolist()
    for x in [fortran, strided, swapped, listed]:
        np.testing.assert_array_equal(s.run({"image": x})["probs"], want)


def test_inputs_are_not_changed_and_stay_writeable(example, example_input):
    x = example_input.copy()
    kiln.Session(example).run({"image": x})
    np.testing.assert_array_equal(x, example_input)
    assert x.flags.writeable, "an input read in place is writeable again after the run"
    ro = example_input.copy()
    ro.flags.writeable = False
    kiln.Session(example).run({"image": ro})
    assert not ro.flags.writeable, "a read-only input stays read-only"


def test_outputs_own_their_memory(example, example_input):
    s = kiln.Session(example)
    out = s.run({"image": example_input})["probs"]
    want = out.copy()
    del s
    gc.collect()
    np.testing.assert_array_equal(out, want)
    out[0, 0] = 5.0  # outputs are writeable arrays of their own
    assert out[0, 0] == 5.0


# --- options ------------------------------------------------------------------------------------


def test_symbolic_dims_and_define_symbol(models):
    s = kiln.Session(models["affine"])
    shape, dtype = s.model_input_shape_dict()["x"]
    assert shape == ("batch", 4) and dtype == "float32"
    for n in [1, 3]:
        x = np.arange(4 * n, dtype=np.float32).reshape(n, 4)
        np.testing.assert_array_equal(s.run({"x": x})["y"], x * 2 + 1)
    for symbols in [{"batch": 2}, [("batch", 2)]]:
        b = kiln.Session(models["affine"], onnx_define_symbol=symbols)
        assert b.model_input_shape_dict()["x"] == ((2, 4), "float32")
        assert b.model_output_shape_dict()["y"] == ((2, 4), "float32")
        with pytest.raises(kiln.InputError, match="x"):
            b.run({"x": np.zeros((3, 4), np.float32)})


def test_options_file_and_keywords(tmp_path, example, example_input):
    opts = tmp_path / "opts.yaml"
    opts.write_text("aic_num_cores: 2\nnum_activations: 3\nenable_metrics: true\n")
    s = kiln.Session(example, options_path=str(opts), num_activations=2)
    assert s.num_of_cores == 2
    b = s.backend_options()
    assert b["num_activations"] == 2, "keyword arguments override the file"
    assert b["num_of_cores"] == 2 and b["enable_metrics"] is True
    s.run({"image": example_input})
    assert s.get_metrics()["num_of_inferences"] == 1


def test_output_dir_writes_the_program(tmp_path, example, example_input):
    s = kiln.Session(example, output_dir=str(tmp_path / "qpc"))
    assert s.program_path is not None and os.path.exists(s.program_path)
    assert str(s.program_path).endswith("tiny_cnn.kiln")
    again = kiln.Session(s.program_path)
    np.testing.assert_array_equal(
        again.run({"image": example_input})["probs"], s.run({"image": example_input})["probs"]
    )


def test_compile_then_open_the_program(tmp_path, example, example_input):
    out = kiln.compile(example, str(tmp_path / "m.kiln"), optimization_type=3)
    assert os.path.exists(out)
    p = kiln.Session(out, num_of_cores=2)
    ref = ort_run(example, {"image": example_input})["probs"]
    np.testing.assert_allclose(p.run({"image": example_input})["probs"], ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(kiln.ConfigurationError, match="optimization_type"):
        kiln.Session(out, optimization_type=1)


def test_no_effect_options_warn(example):
    with pytest.warns(kiln.KilnWarning, match="set_size"):
        kiln.Session(example, set_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kiln.Session(example, num_activations=2)  # implemented: no warning


# --- benchmark, metrics, profile ----------------------------------------------------------------


def test_run_benchmark(example, example_input):
    s = kiln.Session(example, enable_metrics=True)
    done, rate, took, batch = s.run_benchmark()
    assert (done, batch) == (40, 1)
    assert rate > 0 and took > 0 and math.isclose(rate, done / took, rel_tol=1e-6)
    done, _, took, _ = s.run_benchmark(num_inferences=7, input_dict={"image": example_input})
    assert done == 7
    done, _, took, _ = s.run_benchmark(inf_time=0.05)
    assert done >= 1 and took >= 0.05
    m = s.get_metrics()
    assert m["num_of_inferences"] == 1 + 40 + 1 + 7 + 1 + done, "warm-up and measured runs all count"
    with pytest.raises(kiln.ConfigurationError, match="together"):
        s.run_benchmark(num_inferences=3, inf_time=1.0)
    with pytest.raises(kiln.ConfigurationError, match="num_inferences"):
        s.run_benchmark(num_inferences=0)


def test_run_benchmark_with_activations(example):
    s = kiln.Session(example, num_activations=3)
    done, rate, _, _ = s.run_benchmark(num_inferences=30)
    assert done == 30 and rate > 0


def test_metrics(example, example_input, capsys):
    s = kiln.Session(example, enable_metrics=True)
    for _ in range(5):
        s.run({"image": example_input})
    m = s.get_metrics()
    keys = ["num_of_inferences", "min_latency", "max_latency", "P25", "P50", "P75", "P90", "P99", "P999",
            "total_inference_time", "avg_latency"]
    assert sorted(m) == sorted(keys)
    assert m["num_of_inferences"] == 5
    assert 0 < m["min_latency"] <= m["P25"] <= m["P50"] <= m["P75"] <= m["P90"] <= m["P99"] <= m["P999"] <= m["max_latency"]
    assert math.isclose(m["avg_latency"] * 5, m["total_inference_time"], rel_tol=1e-9)
    assert m["max_latency"] < 10, "seconds, not milliseconds"
    s.print_metrics()
    text = capsys.readouterr().out
    assert "Number of inferences utilized for calculation are 5" in text
    assert "P99 / 99% of inferences observed latency less than" in text
    s.reset()
    assert s.get_metrics()["num_of_inferences"] == 0
    s.setup()
    s.run({"image": example_input})
    assert s.get_metrics()["num_of_inferences"] == 1


def test_metrics_need_the_option(example):
    s = kiln.Session(example)
    with pytest.raises(kiln.ConfigurationError, match="enable_metrics"):
        s.get_metrics()
    with pytest.raises(kiln.ConfigurationError, match="enable_metrics"):
        s.print_metrics()
    with pytest.raises(kiln.ConfigurationError, match="enable_profiling"):
        s.print_profile_data(1)
    with pytest.raises(kiln.ConfigurationError, match="enable_metrics"):
        kiln.Session(example, enable_metrics=True, enable_profiling=True)


def test_profile(example, example_input, capsys):
    s = kiln.Session(example, enable_profiling=True)
    for _ in range(3):
        s.run({"image": example_input})
    s.print_profile_data(2)
    text = capsys.readouterr().out
    assert "profile of 2 run(s)" in text
    assert "conv1" in text and "Conv" in text
    assert s.get_metrics()["num_of_inferences"] == 3


def test_backend_options_update(example, example_input):
    s = kiln.Session(example)
    b = s.backend_options()
    for k in ["num_activations", "set_size", "dev_id", "num_of_cores"]:
        assert k in b
    want = s.run({"image": example_input})["probs"]
    s.update_backend_options(num_activations=2, aic_num_cores=2, enable_metrics=True)
    assert s.backend_options()["num_activations"] == 2
    assert s.num_of_cores == 2
    np.testing.assert_array_equal(s.run({"image": example_input})["probs"], want)
    assert s.get_metrics()["num_of_inferences"] == 1
    with pytest.raises(kiln.ConfigurationError, match="did you mean 'num_activations'"):
        s.update_backend_options(num_activation=2)
    with pytest.raises(kiln.ConfigurationError, match="optimization_type"):
        s.update_backend_options(optimization_type=1)
    with pytest.raises(kiln.ConfigurationError, match="num_of_cores"):
        s.update_backend_options(num_of_cores=0)
    assert s.num_of_cores == 2, "a refused update changes nothing"


# --- errors -------------------------------------------------------------------------------------


def test_unknown_and_invalid_options(example):
    with pytest.raises(kiln.ConfigurationError, match="did you mean 'num_activations'") as e:
        kiln.Session(example, num_actvations=3)
    assert isinstance(e.value, kiln.KilnError)
    with pytest.raises(kiln.ConfigurationError, match="num_of_cores"):
        kiln.Session(example, num_of_cores="many")
    with pytest.raises(kiln.ConfigurationError, match="optimization_type"):
        kiln.Session(example, optimization_type=9)
    with pytest.raises(kiln.ConfigurationError):
        kiln.Session(example, options_path="/nonexistent/opts.yaml")


def test_input_errors(example, example_input):
    s = kiln.Session(example)
    with pytest.raises(kiln.InputError, match="unknown input 'imag'.*image"):
        s.run({"imag": example_input})
    with pytest.raises(kiln.InputError, match="missing input 'image'"):
        s.run({})
    with pytest.raises(kiln.InputError, match="image.*f32.*f64"):
        s.run({"image": example_input.astype(np.float64)})
    with pytest.raises(kiln.InputError, match=r"image.*expected 32, got 3"):
        s.run({"image": example_input[..., :3]})
    with pytest.raises(kiln.InputError, match="complex"):
        s.run({"image": example_input.astype(np.complex64)})
    with pytest.raises(kiln.InputError, match="strings"):
        s.run({1: example_input})


def test_model_and_program_file_errors(tmp_path, example):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(kiln.ModelError):
        kiln.Session(str(bad))
    with pytest.raises(kiln.ModelError, match="no such file"):
        kiln.Session(str(tmp_path / "missing.onnx"))
    prog = kiln.compile(example, str(tmp_path / "m.kiln"))
    data = bytearray(open(prog, "rb").read())
    data[len(data) // 2] ^= 0xFF
    broken = tmp_path / "broken.kiln"
    broken.write_bytes(bytes(data))
    with pytest.raises(kiln.ProgramFileError, match="broken.kiln"):
        kiln.Session(str(broken))
    for cls in [kiln.ModelError, kiln.ConfigurationError, kiln.InputError, kiln.ProgramFileError]:
        assert issubclass(cls, kiln.KilnError)


def test_benchmark_random_inputs_need_bound_dims(models):
    s = kiln.Session(models["affine"])
    with pytest.raises(kiln.KilnError, match="batch"):
        s.run_benchmark(num_inferences=1)
    done, *_ = s.run_benchmark(num_inferences=2, input_dict={"x": np.ones((5, 4), np.float32)})
    assert done == 2


# --- threads, the GIL, memory -------------------------------------------------------------------


def test_threads_share_one_session(example, example_input):
    s = kiln.Session(example, num_of_cores=2)
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((1, 3, 32, 32)).astype(np.float32) for _ in range(8)]
    want = [ort_run(example, {"image": x})["probs"] for x in xs]
    errors = []

    def worker(k):
        try:
            for _ in range(25):
                i = (k * 3 + _) % len(xs)
                got = s.run({"image": xs[i]})["probs"]
                np.testing.assert_allclose(got, want[i], rtol=1e-5, atol=1e-6)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_the_same_array_in_several_threads_stays_read_only_until_all_finish(models):
    s = kiln.Session(models["slow"])
    x = np.random.default_rng(5).standard_normal((256, 512)).astype(np.float32)
    results = []
    threads = [threading.Thread(target=lambda: results.append(s.run({"x": x})["y"])) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    assert x.flags.writeable


def test_gil_is_released_while_running(models):
    s = kiln.Session(models["slow"])
    x = np.ones((256, 512), np.float32)
    s.run({"x": x})
    counter = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            counter[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        before = counter[0]
        s.run({"x": x})
        during = counter[0] - before
    finally:
        stop.set()
        t.join()
    # Holding the GIL for the whole run would leave the other thread no bytecode at all.
    assert during > 1000


def test_writes_during_a_run_are_refused(models):
    s = kiln.Session(models["slow"])
    x = np.ones((256, 512), np.float32)
    refused = []
    started = threading.Event()

    def writer():
        started.wait()
        while not refused and t_run.is_alive():
            try:
                x[0, 0] = 3.0
                if not t_run.is_alive():
                    break
            except ValueError:
                refused.append(True)

    t_run = threading.Thread(target=lambda: [started.set(), s.run({"x": x})])
    w = threading.Thread(target=writer)
    w.start()
    t_run.start()
    t_run.join()
    w.join()
    assert refused, "the input was writeable while the run read it"
    assert x.flags.writeable


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_ten_thousand_runs_do_not_grow_memory(example, example_input):
    s = kiln.Session(example)
    for _ in range(500):
        s.run({"image": example_input})
    gc.collect()
    before = _rss_bytes()
    for _ in range(10_000):
        s.run({"image": example_input})
    gc.collect()
    grown = _rss_bytes() - before
    assert grown < 5 * 1024 * 1024, f"RSS grew {grown / 2**20:.2f} MiB over 10,000 runs"


def test_repr_and_paths(example):
    s = kiln.Session(example)
    assert "image" in repr(s) and "probs" in repr(s)
    assert str(s.model_path) == example and s.program_path is None
    assert kiln.__version__


def _loop_feed(m):
    return {"m": np.array(m, np.int64), "cond": np.array(True), "x": np.zeros(1, np.float32)}


def test_run_options_terminate_stops_a_run_from_another_thread(models):
    s = kiln.Session(models["loop"], loop_iteration_limit=200_000_000)
    assert s.run(_loop_feed(5))["y"][0] == 5.0
    ro = kiln.RunOptions()
    assert ro.terminate is False
    timer = threading.Timer(0.05, lambda: setattr(ro, "terminate", True))
    timer.start()
    try:
        with pytest.raises(kiln.CancelledError, match="cancelled"):
            s.run(_loop_feed(1 << 40), run_options=ro)
    finally:
        timer.cancel()
    assert ro.terminate is True
    # Still set: the next run with these options stops before it starts.
    with pytest.raises(kiln.CancelledError, match="before the first node"):
        s.run(_loop_feed(3), run_options=ro)
    ro.terminate = False
    assert s.run(_loop_feed(3), run_options=ro)["y"][0] == 3.0
    assert s.run(_loop_feed(4))["y"][0] == 4.0


def test_limits_raise_limit_error_naming_the_limit(models):
    s = kiln.Session(models["loop"], loop_iteration_limit=100)
    with pytest.raises(kiln.LimitError, match="the_loop.*loop_iteration_limit"):
        s.run(_loop_feed(1000))
    assert s.run(_loop_feed(100))["y"][0] == 100.0
    with pytest.raises(kiln.LimitError, match="run_time_limit_ms"):
        s.run(_loop_feed(10), run_options=kiln.RunOptions(time_limit_ms=0))
    with pytest.raises(kiln.ConfigurationError):
        kiln.RunOptions(time_limit_ms=-1)
    s.update_backend_options(loop_iteration_limit=5000)
    assert s.run(_loop_feed(1000))["y"][0] == 1000.0
    assert s.backend_options()["loop_iteration_limit"] == 5000

    e = kiln.Session(models["expand"], run_memory_limit_mb=16)
    x = np.full(1, 2.5, np.float32)
    assert e.run({"x": x, "shape": np.array([512, 1024], np.int64)})["y"].shape == (512, 1024)
    with pytest.raises(kiln.LimitError, match="grow.*64.0 MiB"):
        e.run({"x": x, "shape": np.array([4096, 4096], np.int64)})
    assert e.run({"x": x, "shape": np.array([2, 3], np.int64)})["y"].sum() == 15.0


def _sampled_crc(a, stride):
    import struct
    import zlib

    b = np.ascontiguousarray(a).tobytes()
    sample = b if stride <= 8 else b"".join(b[i : i + 8] for i in range(0, len(b), stride))
    return zlib.crc32(sample + struct.pack("<Q", len(b)))


def test_io_crc_matches_zlib_and_catches_an_input_changed_during_the_run(models, example, example_input):
    s = kiln.Session(example, gen_crc=True, crc_stride=64)
    out, crc = s.run_with_crc({"image": example_input})
    assert crc["stride"] == 64
    assert crc["inputs"] == {"image": _sampled_crc(example_input, 64)}
    assert crc["outputs"] == {name: _sampled_crc(v, 64) for name, v in out.items()}

    # A numpy view of a bytearray: the run holds the array read-only, but the bytearray
    # itself is another way in.
    loop = kiln.Session(models["loop"], gen_crc=True, crc_stride=1)
    buf = bytearray(np.zeros(1, np.float32).tobytes())
    x = np.frombuffer(buf, np.float32)
    feed = {"m": np.array(1_000_000, np.int64), "cond": np.array(True), "x": x}
    timer = threading.Timer(0.02, lambda: buf.__setitem__(slice(0, 4), np.float32(7.0).tobytes()))
    timer.start()
    try:
        with pytest.raises(kiln.InputError, match="'x' changed during the run"):
            loop.run(feed)
    finally:
        timer.cancel()
    # Unchanged, the same run passes the check.
    feed["m"] = np.array(10, np.int64)
    assert loop.run(feed)["y"][0] == 17.0


def test_save_error_artifact_writes_a_bundle_for_a_failed_run(tmp_path, models):
    s = kiln.Session(models["expand"], save_error_artifact=True, output_dir=str(tmp_path), run_memory_limit_mb=1)
    with pytest.raises(kiln.LimitError, match="error artifact written to") as e:
        s.run({"x": np.ones(1, np.float32), "shape": np.array([1024, 1024], np.int64)})
    bundles = list(tmp_path.glob("kiln-error-run-*"))
    assert len(bundles) == 1, bundles
    assert str(bundles[0]) in str(e.value)
    info = __import__("json").loads((bundles[0] / "bundle.json").read_text())
    assert info["stage"] == "run" and info["node"] == "grow"
    feed = np.load(bundles[0] / "inputs.npz")
    assert feed["shape"].tolist() == [1024, 1024]
