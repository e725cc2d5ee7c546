"""Quantizing from Python (issue 29): kiln.Session(model, convert_to_quantize=True,
calibration_data=[{input: array}, ...]) calibrates on the samples, reports its accuracy, and
stays close to the float model without being it."""

import numpy as np
import pytest

import kiln


def _samples(example_input, n):
    return [{"image": (example_input * (1.0 - 0.25 * k)).astype(np.float32)} for k in range(n)]


def test_calibration_data_quantizes_and_reports(example, example_input):
    f = kiln.Session(example)
    q = kiln.Session(example, convert_to_quantize=True, enable_channelwise=True,
                     calibration_data=_samples(example_input, 4))
    r = q.quantization_report
    assert r["mode"] == "convert_to_quantize"
    assert r["samples"] == 4
    assert r["weights"] >= 1 and r["per_channel_weights"] >= 1
    assert r["outputs"][0]["sqnr_db"] > 15
    assert f.quantization_report is None
    want = f.run({"image": example_input})["probs"]
    got = q.run({"image": example_input})["probs"]
    assert np.argmax(got) == np.argmax(want)
    assert np.abs(got - want).max() < 0.05
    assert not np.array_equal(got, want)


def test_every_calibration_method_from_python(example, example_input):
    for method in ["None", "KLMinimization", "KLMinimizationV2", "Percentile", "MSE", "SQNR"]:
        q = kiln.Session(example, convert_to_quantize=True, quantization_calibration=method,
                         percentile_calibration_value=99.9, calibration_data=_samples(example_input, 3))
        assert method.split("V2")[0][:3] in q.quantization_report["method"] or method == "None"
        assert q.run({"image": example_input})["probs"].shape == (1, 10)


def test_calibration_data_mistakes_are_clear(example, example_input):
    with pytest.raises(kiln.ConfigurationError, match="convert_to_quantize"):
        kiln.Session(example, calibration_data=_samples(example_input, 2))
    with pytest.raises(kiln.ConfigurationError, match="one dict per sample"):
        kiln.Session(example, convert_to_quantize=True, calibration_data="samples/")
    with pytest.raises(Exception, match="calibration_data\\[1\\]"):
        kiln.Session(example, convert_to_quantize=True, calibration_data=[{"image": example_input}, 3])
    with pytest.raises(kiln.KilnError, match="calibration data"):
        kiln.Session(example, convert_to_quantize=True)


def test_compile_writes_a_quantized_program_with_its_report(tmp_path, example, example_input):
    out = kiln.compile(example, str(tmp_path / "q.kiln"), convert_to_quantize=True,
                       calibration_data=_samples(example_input, 3))
    s = kiln.Session(out)
    assert s.quantization_report["mode"] == "convert_to_quantize"
    assert s.run({"image": example_input})["probs"].shape == (1, 10)
