import pytest

from specgen.errors import ModelError
from specgen.core.protocol import VocabInfo
from specgen.core.vocab import check_compatible, sample_ids


def info(**kw):
    base = dict(vocab_type=1, n_vocab=1000, bos=1, eos=2, samples=((5, b"a"), (6, b"b")))
    return VocabInfo(**{**base, **kw})


def test_compatible_vocabularies_pass_including_small_padding_difference():
    check_compatible(info(), info(), "t", "d")
    check_compatible(info(n_vocab=1000), info(n_vocab=1000 - 128), "t", "d")


@pytest.mark.parametrize("draft,message", [
    (info(vocab_type=2), "vocabulary type 2 vs 1"),
    (info(n_vocab=1200), "vocabulary size 1200 vs 1000"),
    (info(eos=3), "BOS/EOS ids 1/3 vs 1/2"),
    (info(samples=((5, b"a"), (6, b"x"))), "token 6 is b'x' in the draft but b'b' in the target"),
])
def test_each_mismatch_is_named(draft, message):
    with pytest.raises(ModelError, match="draft d does not match target t: " + message):
        check_compatible(info(), draft, "t", "d")


def test_sample_ids_cover_specials_and_spread():
    ids = sample_ids(262144)
    assert ids[:256] == list(range(256)) and max(ids) > 260000 and len(ids) < 2400
