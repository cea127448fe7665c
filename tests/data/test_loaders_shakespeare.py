"""Shakespeare loader on tiny works written in the Project Gutenberg layout."""
from __future__ import annotations

import pytest
import torch

from fedveil.data import DATASETS, DataError
from fedveil.data.loaders.shakespeare import UNKNOWN, encode, load_shakespeare, parse_play

PLAY = """\
THE TRAGEDY OF TESTS

by William Shakespeare


PERSONS REPRESENTED.

Alpha, a tester.
Beta, a reviewer.

SCENE. A laboratory.


ACT I.

Scene I. A room.

[Enter Alpha and Beta, with
Attendants.]

Alph.
To be or not.

Beta. [Aside.]
That is [Sings.] it.

Alph.
  Answer   me.

[Exit Beta.]

Well said.

ACT II.

Stray words.

FIRST CLOWN
Ho!
"""
POEM = """\
THE SONNETS

I

From fairest creatures we desire increase,
That thereby beauty's rose might never die,
"""


def write_works(tmp_path, **works):
    for name, text in works.items():
        (tmp_path / f"{name}.txt").write_text(text)
    return tmp_path


def decode(indices, vocab):
    return "".join(vocab[i] for i in indices)


def test_registered():
    assert DATASETS.get("shakespeare") is load_shakespeare


def test_parse_play_assigns_speech_to_roles():
    assert parse_play(PLAY) == {
        # a speech continues across stage directions and blank lines until the next speaker
        "Alph": "To be or not.\nAnswer me.\nWell said.",
        "Beta": "That is it.",  # the speaker line's [Aside.] and inline [Sings.] are removed
        "FIRST CLOWN": "Ho!",  # "Stray words." follows a heading, not a speaker: dropped
    }


def test_parse_poem_has_no_roles():
    assert parse_play(POEM) == {}


def test_parse_ignores_gutenberg_licence():
    text = (
        "The Project Gutenberg eBook of Tests\n*** START OF THE PROJECT GUTENBERG EBOOK TESTS ***\n"
        + PLAY
        + "*** END OF THE PROJECT GUTENBERG EBOOK TESTS ***\n\nACT I.\n\nAlph.\nLicence terms.\n"
    )
    assert parse_play(text) == parse_play(PLAY)


def test_encode_vocabulary():
    assert encode("\n a~").tolist() == [0, 1, ord("a") - 31, 95]
    assert encode("é\t").tolist() == [UNKNOWN, UNKNOWN]


def test_windows_targets_and_clients(tmp_path):
    root = write_works(tmp_path, tests=PLAY, sonnets=POEM)
    source = load_shakespeare(root, seq_len=4, stride=2, min_chars=5)
    data, vocab = source.train, source.train.info["vocab"]
    assert data.info["roles"] == ["tests:Alph", "tests:Beta"]  # "Ho!" is under min_chars
    assert source.natural_groups == "client" and source.test is None
    assert source.num_classes == len(vocab) + 1 == 97
    assert data.x.dtype == data.y.dtype == torch.int64
    windows = [(decode(x, vocab), vocab[y]) for x, y in zip(data.x.tolist(), data.y.tolist())]
    # Alph's speech "To be or not.\nAnswer me.\nWell said." has 35 characters: 16 windows
    # start at 0, 2, ..., 30; Beta's "That is it." has 11: windows start at 0, 2, 4, 6
    assert windows[:3] == [("To b", "e"), (" be ", "o"), ("e or", " ")]
    assert windows[15] == ("said", ".")
    assert windows[16:] == [("That", " "), ("at i", "s"), (" is ", "i"), ("s it", ".")]
    assert data.groups["client"].tolist() == [0] * 16 + [1] * 4


def test_default_stride_is_seq_len(tmp_path):
    data = load_shakespeare(write_works(tmp_path, tests=PLAY), seq_len=4, min_chars=5).train
    beta = data.subset(data.groups["client"] == 1)
    vocab = data.info["vocab"]
    assert [(decode(x, vocab), vocab[y]) for x, y in zip(beta.x.tolist(), beta.y.tolist())] == [
        ("That", " "), (" is ", "i"),
    ]


def test_max_roles_keeps_longest(tmp_path):
    source = load_shakespeare(write_works(tmp_path, tests=PLAY), seq_len=2, min_chars=3, max_roles=2)
    assert source.train.info["roles"] == ["tests:Alph", "tests:Beta"]
    source = load_shakespeare(write_works(tmp_path, tests=PLAY), seq_len=2, min_chars=3, max_roles=1)
    assert source.train.info["roles"] == ["tests:Alph"]
    assert set(source.train.groups["client"].tolist()) == {0}


def test_missing_or_empty_directory(tmp_path):
    with pytest.raises(DataError, match="no Shakespeare plays in .*missing.*one Project Gutenberg .txt"):
        load_shakespeare(tmp_path / "missing")
    (tmp_path / "README.md").write_text("not a play")
    with pytest.raises(DataError, match="cannot be downloaded"):
        load_shakespeare(tmp_path)


def test_only_poems_or_short_roles(tmp_path):
    with pytest.raises(DataError, match="no speaking role has 1000 characters"):
        load_shakespeare(write_works(tmp_path, sonnets=POEM, tests=PLAY))


def test_bad_arguments(tmp_path):
    root = write_works(tmp_path, tests=PLAY)
    with pytest.raises(ValueError, match="min_chars"):
        load_shakespeare(root, seq_len=80, min_chars=80)
    with pytest.raises(ValueError, match="stride"):
        load_shakespeare(root, seq_len=4, stride=0, min_chars=5)
    with pytest.raises(ValueError, match="max_roles"):
        load_shakespeare(root, seq_len=4, min_chars=5, max_roles=0)
