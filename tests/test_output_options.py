"""The output options (``minidet.apps.outputs.options``): built once from a program's arguments, frozen, and sent
as they are to a Ray actor or a server worker (pickled); the server's pipe messages are the same objects on both
sides."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from minidet.apps import eval_coco, infer
from minidet.apps.outputs.options import OutputOptions, parse_classes
from minidet.apps.serve.protocol import Request, ServerError
from minidet.errors import ConfigError

REQUIRED = ["--config-file", "c.yaml", "--input", "a.jpg", "--output", "o"]


def test_infer_and_eval_build_their_options_once_from_their_arguments():
    args = infer.parse_args([*REQUIRED, "--classes", "person,dog", "--no-vis", "--mask-format", "polygon",
                             "--polygon-tolerance", "1.5", "--slice", "512", "--overlap", "0.25", "--full-pass"])
    o = args.options
    assert (o.classes, o.no_vis, o.mask_format, o.tolerance, o.score_thresh) == ("person,dog", True, "polygon", 1.5, 0)
    assert (o.slicing.size, o.slicing.overlap, o.slicing.full_pass, o.slicing.merge) == (512, 0.25, True, "nmm")
    assert infer.parse_args(REQUIRED).options == OutputOptions()  # the defaults are infer's
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.no_vis = False  # type: ignore[misc]
    args = eval_coco.parse_args(["--ann", "a.json", "--results", "r.json", "--output", "o", "--mask-format", "none"])
    assert args.options == OutputOptions(mask_format="none")  # eval has --mask-format alone


def test_options_and_pipe_messages_survive_pickling():
    args = infer.parse_args([*REQUIRED, "--slice", "256", "--classes", "person"])
    assert pickle.loads(pickle.dumps(args.options)) == args.options  # what a Ray actor is given
    request = Request(b"\x89PNG", "a.png", OutputOptions(classes="person", score_thresh=0.5))
    assert pickle.loads(pickle.dumps(request)) == request  # what a server worker is sent
    assert pickle.loads(pickle.dumps(ServerError("boom"))).status == 500
    assert OutputOptions(classes="Person, DOG").keep(["__background__", "person", "cat", "dog"]) == {1, 3}
    assert OutputOptions().keep(["person"]) is None


def test_a_class_name_refused_names_the_option_that_gave_it():
    names = ["__background__", "person", "dog"]
    with pytest.raises(ConfigError, match=r"^--classes: unknown class 'cat' \(the model's classes: person, dog\)$"):
        OutputOptions(classes="cat").keep(names)
    with pytest.raises(ConfigError, match=r"^classes: no class given \(the model's classes: person, dog\)$"):
        parse_classes(" , ", names, option="classes")  # the server's query parameter


@pytest.mark.parametrize("given", [["--overlap", "0.3"], ["--overlap", "0.2"], ["--merge", "nms"], ["--match", "iou"],
                                   ["--match-thresh", "0.6"], ["--full-pass"], ["--max-tiles", "5"]])
def test_a_slicing_option_without_slice_is_one_usage_line(given, capsys):
    """Issue 56 item 9b: ``--overlap`` (any ``--slice`` option, its default value too) without ``--slice`` was
    accepted without a word and did nothing; refused as eval refuses options that do not apply."""
    with pytest.raises(SystemExit) as stop:
        infer.parse_args([*REQUIRED, *given])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (f"infer.py: error: {given[0]} applies to sliced inference "
                                                        "only: give --slice S too, or leave it out")
    assert infer.parse_args([*REQUIRED, "--slice", "512", *given]).options.slicing is not None


@pytest.mark.parametrize("fmt", ["rle", "none"])
def test_polygon_tolerance_without_polygon_masks_is_one_usage_line(fmt, capsys):
    """Issue 56 item 9b: ``--polygon-tolerance`` simplifies polygons only; with RLE masks (the default) or none it
    was accepted and did nothing."""
    fmt_args = [] if fmt == "rle" else ["--mask-format", fmt]
    with pytest.raises(SystemExit) as stop:
        infer.parse_args([*REQUIRED, *fmt_args, "--polygon-tolerance", "1.5"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (f"infer.py: error: --polygon-tolerance simplifies polygons: "
                                                        f"give --mask-format polygon too (the masks are {fmt})")
    assert infer.parse_args([*REQUIRED, *fmt_args, "--polygon-tolerance", "0"]).options.tolerance == 0
    assert infer.parse_args([*REQUIRED, "--mask-format", "polygon", "--polygon-tolerance", "1.5"]).options.tolerance \
        == 1.5
