"""Precisions other than float32 (``minidet export --precision int8|bf16``, ``MODEL.RUNTIME_PRECISION``): the
table's rules, the drift report's matching and AP, the int8 export (NNCF, OpenVINO) with its drift gate refusing
and ``--force``, the folder run by infer and eval and checked where it runs, bf16 refused where the CPU lacks it.

The int8 export is made once per session (``conftest.int8_export``); the Ray engine runs it in test_infer_ray.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import minidet
from helpers import ROOT, call_tool, needs_extra, one_error_line, run_tool
from minidet.config import validate_cfg
from minidet.runtimes import PRECISIONS, precision_problem

for _module, _extra in (("onnx", "export"), ("onnxscript", "export"), ("openvino", "openvino"), ("nncf", "int8")):
    needs_extra(_module, _extra)
EXPORT = ROOT / "tools" / "export.py"
THREADS = torch.get_num_threads()


# --------------------------------------------------------------------------- the table and the report's arithmetic


@pytest.mark.parametrize(("runtime", "precision", "words"), [
    ("torch", "int8", "is the precision of an exported graph's runtime"),
    ("onnxruntime", "int8", "runs under MODEL.RUNTIME openvino, not onnxruntime"),
    ("onnxruntime", "bf16", "runs under MODEL.RUNTIME openvino, not onnxruntime"),
])
def test_a_precision_its_runtime_cannot_run_is_one_line(runtime, precision, words):
    cfg = minidet.get_cfg("torchvision/maskrcnn_resnet50_fpn")
    cfg.merge_from_list(["MODEL.RUNTIME", runtime, "MODEL.RUNTIME_PRECISION", precision])
    with pytest.raises(minidet.config.ConfigError, match=words):
        validate_cfg(cfg)
    assert not precision_problem("int8", "openvino") and not precision_problem("fp32", "onnxruntime")
    assert PRECISIONS["fp32"].exact and not PRECISIONS["int8"].exact and PRECISIONS["int8"].graph == "model.xml"


def test_a_graph_runs_only_in_the_precision_it_was_exported_in():
    from minidet.export.onnxfile import precision_mismatch

    assert precision_mismatch("fp32", "fp32") == precision_mismatch("fp32", "bf16") == ""  # bf16: the same graph
    assert "set MODEL.RUNTIME_PRECISION int8" in precision_mismatch("int8", "fp32")
    assert "--precision int8" in precision_mismatch("fp32", "int8")


def test_layers_are_quantized_by_module():
    from minidet.export.quantize import is_quantized, module_of

    assert module_of(["", "backbone", "backbone.res2", "backbone.res2.0.conv1", "conv2d_2"]) == "backbone.res2.0.conv1"
    assert is_quantized("backbone.res3.1.conv2/node_Conv_7") and is_quantized("fpn.output2/node_Conv_9/WithoutBiases")
    assert is_quantized("box_head.fc1/node_linear") and is_quantized("fpn/node_upsample_nearest2d")
    for name in ("backbone.stem.conv1/node_Conv_1", "rpn.head.convs.0/node_Conv_3", "mask_head.mask_fcn1/node_Conv",
                 "box_predictor.cls_score/node_linear_2", "node_NonMaxSuppression_4", "Multiply_3744"):
        assert not is_quantized(name), name


def _dets(boxes, scores, labels, masks=True, size=(60, 80)):
    from minidet.masks import BoxMasks

    boxes = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
    out = {"boxes": boxes, "scores": torch.tensor(scores), "labels": torch.tensor(labels)}
    if masks:
        dense = torch.zeros(len(boxes), *size, dtype=torch.bool)
        for i, (x0, y0, x1, y1) in enumerate(boxes.round().long().tolist()):
            dense[i, y0:y1, x0:x1] = True
        out["masks"] = BoxMasks.from_dense(dense)
    return out


def test_drift_matching_and_ap_against_float32():
    """The same detections: all matched, AP 1; one box moved off its object, one relabelled: two of three lost and
    AP below 1; detections under the score are not judged."""
    from minidet.apps.export.drift import _coco, ap_against, match

    ref = _dets([[5, 5, 30, 30], [40, 10, 70, 50], [10, 35, 25, 55]], [0.9, 0.8, 0.3], [1, 2, 1])
    same = match(ref, ref, 0.5)
    assert same["float32"] == 2 and same["matched"] == 2 and same["changes"]["mask_iou"] == [1.0, 1.0]
    assert ap_against([_coco(0, ref)], [_coco(0, ref)], [(60, 80)], 0.5) == {"bbox": pytest.approx(1.0),
                                                                             "segm": pytest.approx(1.0)}
    moved = _dets([[20, 20, 45, 45], [40, 10, 70, 50], [10, 35, 25, 55]], [0.9, 0.8, 0.3], [1, 3, 1])
    m = match(ref, moved, 0.5)
    assert m["float32"] == 2 and m["matched"] == 0
    ap = ap_against([_coco(0, ref)], [_coco(0, moved)], [(60, 80)], 0.5)
    assert ap["bbox"] < 1 and ap["segm"] < 1
    nothing = ap_against([_coco(0, ref)], [_coco(0, ref)], [(60, 80)], 0.95)  # nothing to be the truth
    assert nothing == {"bbox": None, "segm": None}


def test_calibration_images_spread_over_a_folder(tmp_path):
    from minidet.apps.export.program import calibration_images

    for i in range(10):
        (tmp_path / f"{i:02d}.jpg").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    got = calibration_images([str(tmp_path)], 4)
    assert [p[-6:] for p in got] == ["00.jpg", "02.jpg", "05.jpg", "07.jpg"]
    with pytest.raises(minidet.config.ConfigError, match="--calib .*missing: not found"):
        calibration_images([str(tmp_path / "missing")], 4)


# --------------------------------------------------------------------------- the int8 export, run where users run it


@pytest.mark.slow
def test_int8_export_refused_by_its_gate_then_forced(int8_export, tv_file, tmp_path, capfd):
    """The gate set so that it must refuse: without --force one error line, status 1, only report.json (with the
    drift); with --force (the session's export) the folder is written and marked, the report complete."""
    out, forced, images = int8_export
    assert forced.returncode == 0 and "written anyway (--force)" in forced.stderr, forced.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "model.bin", "model.xml", "report.json"]
    text = (out / "config.yaml").read_text()
    assert "int8 drift gate FAILED (written with --force)" in text.splitlines()[0]
    cfg = minidet.get_cfg(str(out / "config.yaml"))
    assert (cfg.MODEL.RUNTIME, cfg.MODEL.RUNTIME_PRECISION, cfg.MODEL.GRAPH) == ("openvino", "int8",
                                                                                 str(out / "model.xml"))
    report = json.loads((out / "report.json").read_text())
    assert report["precision"] == "int8" and not report["exact"] and report["forced"]
    q = report["quantization"]
    assert q["tool"] == "NNCF" and q["calibration_images"] == 2 and not q["overlaps_verification"]
    assert q["layers"]["int8"] > 50 and set(q["kept_float"]) == {"backbone.stem", "rpn.head", "box_predictor",
                                                                  "mask_head"}
    assert "backbone.stem.conv1" in q["float32_layers"] and "mask_head.predictor" in q["float32_layers"]
    facts = report["runtime_facts"]
    assert facts["name"] == "openvino" and facts["precision"] == "int8" and facts["layers"]["int8"] > 50
    assert facts["options"]["INFERENCE_PRECISION_HINT"] == "f32" and "flags" in report["cpu"]
    d = report["drift"]
    assert not d["passed"] and "matched" in d["why"] and d["float32_detections"] > 0
    assert set(d["stages"]) == {"backbone", "fpn", "rpn", "box_head", "mask_head"} and 0 < d["stages"]["backbone"]
    assert d["ap"]["bbox"] is not None and d["ap"]["segm"] is not None and d["mask_iou"]["median"] > 0
    assert set(d["seconds_per_image"]) == {"eager", "float32 graph", "graph"}
    refused = tmp_path / "refused"
    r = run_tool(EXPORT, "--config-file", "torchvision/maskrcnn_resnet50_fpn", "--output", str(refused),
                 "--precision", "int8", "--calib", str(images[0]), "--images", str(images[1]), "--repeats", "0",
                 "--min-matched", "1", "--min-ap", "1", "MODEL.WEIGHTS", str(tv_file), "INPUT.MIN_SIZE_TEST", "320",
                 "INPUT.MAX_SIZE_TEST", "512", cwd=tmp_path, threads=torch.get_num_threads())  # NNCF: conftest
    line = one_error_line("\n".join(x for x in r.stderr.splitlines() if x.startswith(("error", "Traceback"))))
    assert r.returncode == 1 and "the int8 drift gate failed" in line and "nothing exported" in line, r.stderr
    assert sorted(p.name for p in refused.iterdir()) == ["report.json"]
    kept = json.loads((refused / "report.json").read_text())
    assert not kept["written"] and kept["drift"]["why"] and kept["quantization"]["overlaps_verification"] == []


@pytest.mark.slow
def test_int8_folder_runs_in_infer_and_eval_and_checks_where_it_runs(int8_export, tmp_path, capfd):
    """The runs that compute in int8 in processes of their own (OpenVINO's int8 kernels are kept out of the test
    process); the refusals, which come before any graph is compiled, in this one."""
    out, _, images = int8_export
    tiny = images[0].parent.parent
    r = run_tool(ROOT / "tools" / "infer.py", "--config-file", str(out / "config.yaml"), "--input", str(images[0]),
                 "--output", str(tmp_path / "infer"), "--workers", "0", "--no-vis", cwd=tmp_path, threads=THREADS)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "infer" / f"{images[0].stem}.json").read_text())["instances"]
    r = run_tool(ROOT / "tools" / "eval_coco.py", "--config-file", str(out / "config.yaml"), "--ann",
                 str(tiny / "annotations" / "instances_val2017.json"), "--images", str(tiny / "val2017"),
                 "--output", str(tmp_path / "eval"), "--max-images", "2", "--workers", "0", cwd=tmp_path,
                 threads=THREADS)
    assert r.returncode == 0, r.stderr
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert {"bbox", "segm"} <= set(metrics) and len(metrics["segm"]["stats"]) == 12
    r = run_tool(EXPORT, "--check", str(out), "--images", str(images[0]), "--repeats", "0", "--min-matched", "0",
                 "--min-ap", "0", "--json", str(tmp_path / "check.json"), cwd=tmp_path, threads=THREADS)
    assert r.returncode == 0 and "passes the int8 drift gate" in r.stdout, (r.stdout, r.stderr)
    checked = json.loads((tmp_path / "check.json").read_text())
    assert checked["precision"] == "int8" and checked["drift"]["matched"] is not None
    for key, value, words in (("MODEL.RUNTIME_PRECISION", "fp32", "set MODEL.RUNTIME_PRECISION int8"),
                              ("MODEL.RUNTIME", "onnxruntime", "runs under MODEL.RUNTIME openvino")):
        r = call_tool(ROOT / "tools" / "infer.py", "--config-file", str(out / "config.yaml"), "--input",
                      str(images[0]), "--output", str(tmp_path / value), "--workers", "0", key, value, capture=capfd)
        assert r.returncode == 2 and words in one_error_line(r.stderr), r.stderr
    damaged = out.parent / f"damaged-{tmp_path.name}"  # beside the export: its config's weights (../tv.pth) hold
    shutil.copytree(out, damaged)
    weights = bytearray((damaged / "model.bin").read_bytes())
    weights[len(weights) // 2] ^= 1
    (damaged / "model.bin").write_bytes(bytes(weights))
    r = call_tool(ROOT / "tools" / "infer.py", "--config-file", str(damaged / "config.yaml"), "--input",
                  str(images[0]), "--output", str(tmp_path / "d"), "--workers", "0", capture=capfd)
    assert r.returncode == 2 and "the file is damaged or was replaced" in one_error_line(r.stderr)


@needs_extra("onnx", "export")
@needs_extra("openvino", "openvino")
def test_bf16_is_refused_where_the_cpu_has_none(tmp_path, capfd, monkeypatch):
    """bf16 on a CPU without bf16 (OpenVINO's capabilities without BF16, as on such a CPU): one line naming the
    precision, status 2, nothing exported. The check itself is the one the runtime makes (``cpu_lacks``)."""
    import openvino

    real = openvino.Core.get_property

    def without_bf16(self, device, name, *rest):
        value = real(self, device, name, *rest)
        return [c for c in value if c != "BF16"] if name == "OPTIMIZATION_CAPABILITIES" else value

    monkeypatch.setattr(openvino.Core, "get_property", without_bf16)
    r = call_tool(EXPORT, "--config-file", "torchvision/maskrcnn_resnet50_fpn", "--output", str(tmp_path / "out"),
                  "--precision", "bf16", "MODEL.WEIGHTS", "none", capture=capfd)
    assert r.returncode == 2 and one_error_line(r.stderr) == (
        "error: --precision bf16: this CPU has no bf16 instructions OpenVINO computes with (AVX512_BF16 or AMX); "
        "use fp32"), r.stderr
    assert not (tmp_path / "out" / "model.onnx").exists()


def test_export_options_of_a_precision_are_checked(capfd):
    for args, words in ((["--precision", "int8"], "--precision int8 needs --calib"),
                        (["--precision", "int8", "--calib", "x.jpg", "--runtime", "onnxruntime"],
                         "runs under MODEL.RUNTIME openvino, not onnxruntime"),
                        (["--calib", "x.jpg"], "--calib goes with --precision int8"),
                        (["--precision", "int8", "--calib", "x.jpg", "--min-ap", "2"], "in [0, 1]")):
        r = call_tool(EXPORT, "--config-file", "torchvision/maskrcnn_resnet50_fpn", "--output", "o", *args,
                      capture=capfd)
        assert r.returncode == 2 and words in r.stderr, (args, r.stderr)


def test_the_numeric_options_of_each_precision():
    from minidet.export.onnxfile import openvino_options

    assert openvino_options("int8", 2)["INFERENCE_PRECISION_HINT"] == "f32"
    assert openvino_options("int8", 2)["EXECUTION_MODE_HINT"] == "ACCURACY"
    assert openvino_options("bf16", 2)["INFERENCE_PRECISION_HINT"] == "bf16"
    assert set(PRECISIONS) == {"fp32", "bf16", "int8"}
