"""`reports.numbering`: layers and heads shown from 1, and the notes that say how they map
to the 0-based keys and per-head lists of the JSON outputs."""

import numpy as np

from beyondpar.reports import numbering


def test_layers_and_heads_are_numbered_from_one():
    assert [numbering.number(i) for i in (0, 1, 5)] == [1, 2, 6]
    assert numbering.number("3") == 4  # a JSON key
    assert numbering.head_number(np.int64(2)) == 3
    assert numbering.head_name(0) == "head 1"
    assert numbering.head_name(np.int32(2)) == "head 3"


def test_head_note_says_head_h_is_index_h_minus_1():
    assert numbering.head_note() == (
        "Heads are numbered from 1: head h is index h-1 of each per-head list in the JSON outputs."
    )


def test_note_names_every_output_and_the_heads_only_when_asked():
    layers = (
        "Layers are numbered from 1, as in the paper: layer k in this report is key k-1 in "
        "summary.json and --layer."
    )
    assert numbering.note("summary.json", "--layer", heads=False) == layers
    assert numbering.note("summary.json", "--layer") == f"{layers} {numbering.head_note()}"
