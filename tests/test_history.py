"""Drafting from other texts than the current one: earlier texts of this process, the persistent
store (bounded, safe with several writers), a corpus; auto learns each source apart and stays lossless."""

import multiprocessing
import sys

import numpy as np

from fakes import FakeContext, FakeModel
from harness import generated
from specgen.costs.curve import CostCurve
from specgen.drafting.history import CORPUS, PROCESS, SEPARATOR, STORE, History, Store, TextIndex, join, store_path
from specgen.drafting.store import FILE_HEADER, encode, parse
from specgen.drafting.methods import METHODS, DrafterInputs
from specgen.core.sampling import SamplingParams

FLAT = CostCurve([1, 32], [0.010, 0.012])


def test_the_longest_match_is_found_and_newest_first_among_equals():
    quote = list(range(100, 140))  # a 40-token passage
    tokens = join([[1, 2, 3, 9, 9], quote + [7, 7], [5, 2, 3, 8], [6, 2, 3, 4]])
    index = TextIndex(tokens)
    context = [50, 51] + quote[:30]
    (length, start), *_ = index.matches(context, 4)
    assert length == 30 and index.continuation(start, 5) == quote[30:35]  # found as a 30-token match
    assert index.continuation(start, 40) == quote[30:] + [7, 7]  # and stops at the text's end
    short = index.matches([0, 2, 3], 4)  # "2 3" recurs, but 2 tokens are below min_n
    assert short == []
    again = TextIndex(join([[4, 2, 3, 5], [4, 2, 3, 6]])).matches([4, 2, 3], 4)
    assert [TextIndex(join([[4, 2, 3, 5], [4, 2, 3, 6]])).continuation(s, 1) for _, s in again] == [[6], [5]]


def test_no_match_spans_two_texts():
    index = TextIndex(join([[1, 2, 3], [4, 5, 6]]))
    assert index.matches([2, 3, 4, 5], 4) == []  # 3 | 4 across the separator is not text


def test_sources_are_searched_nearest_first(tmp_path):
    store = Store(tmp_path / "h.u32")
    store.append([10, 11, 12, 13, 14])
    history = History(store, corpus=[[10, 11, 12, 99]])
    assert [(c.source, c.tokens) for c in history.continuations([10, 11, 12], 2, 4)] == [(STORE, [13, 14])]
    history.add_text([10, 11, 12, 77, 78])
    assert history.continuations([10, 11, 12], 2, 4)[0].source == PROCESS
    history.forget_texts()
    assert History(None, corpus=[[10, 11, 12, 99]]).continuations([10, 11, 12], 2, 4)[0].source == CORPUS
    assert list(Store(tmp_path / "h.u32").read()) == [10, 11, 12, 13, 14, SEPARATOR, 10, 11, 12, 77, 78, SEPARATOR]


def test_the_store_keeps_its_newest_whole_texts_when_it_grows_too_big(tmp_path):
    store = Store(tmp_path / "h.u32", max_tokens=30, keep_tokens=15)
    for i in range(10):
        store.append([i] * 5)  # 6 tokens each with the separator
    data = list(store.read())
    assert len(data) <= 30 and data[-6:] == [9] * 5 + [SEPARATOR]
    texts = [t for t in " ".join(map(str, data)).split(str(SEPARATOR)) if t.strip()]
    assert all(len(set(t.split())) == 1 and len(t.split()) == 5 for t in texts)  # no text cut in half


TEXTS = 120


def _writer(path, i, barrier):
    """Appends TEXTS texts in lockstep with the other writers; after each, its own text must be in
    the store (at most 3 others came after it, and a cut keeps the newest 5): exit 1 where not."""
    store = Store(path, max_tokens=64, keep_tokens=40)  # a cut every few texts: cuts meet appends
    for j in range(TEXTS):
        barrier.wait()  # every writer's j-th text between the others' j-1-th and j+1-th: they interleave
        store.append([i * 1000 + j] * 7)
        if i * 1000 + j not in Store(path).read():
            barrier.abort()  # the others stop at their next wait (BrokenBarrierError) instead of waiting for this one
            sys.exit(1)  # lost: another writer's cut replaced the file over this append


def test_several_processes_can_write_at_once(tmp_path):
    """Four processes append in lockstep (a barrier before each text), so writes and the cuts that
    keep the store under its size meet; every text survives whole and unmixed, the newest kept."""
    path = tmp_path / "h.u32"
    barrier = multiprocessing.Barrier(4)
    procs = [multiprocessing.Process(target=_writer, args=(path, i, barrier)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert [p.exitcode for p in procs] == [0] * 4, "a writer's text was lost (exit 1) or a writer failed"
    data = Store(path).read()
    chunks = np.split(data, np.nonzero(data == SEPARATOR)[0] + 1)
    texts = [c[:-1] for c in chunks if len(c)]
    assert texts and all(len(t) == 7 and len(set(t.tolist())) == 1 for t in texts)  # whole, unmixed
    assert 40 - 8 <= len(data) <= 64  # a cut keeps the newest whole texts that fit in 40 tokens
    for i in range(4):  # cuts drop the oldest: what is left of each writer is its newest, none lost between
        mine = [int(t[0]) - i * 1000 for t in texts if t[0] // 1000 == i]
        assert mine and mine == list(range(TEXTS - len(mine), TEXTS)), f"writer {i}: {mine}"  # all four wrote last


LOOPY = {(3, 4): 5, (4, 5): 6, (5, 6): 3, (6, 3): 4}


def run_auto(auto, target, prompt, n):
    tokens = generated(target, FakeContext(target, n_ctx=512, n_seq_max=32), prompt, n, SamplingParams(), auto).tokens
    auto.finish_text()
    return tokens


def test_a_later_prompt_drafts_from_an_earlier_output_and_stays_lossless():
    """The second of two prompts that lead to the same text drafts from the first one's output
    ("history"), learned apart from this text's own matches; every output equals plain's."""
    script = {(9, 8): 3, (8, 3): 4, **LOOPY}
    target = FakeModel(n_vocab=16, sharpness=2.0, script=script)
    auto = METHODS["auto"].drafter(DrafterInputs(SamplingParams(), None, FLAT, history=History()))
    first = run_auto(auto, target, [0, 9, 8], 24)
    before = auto.choices["history"]
    second = run_auto(auto, target, [0, 2, 9, 8], 24)
    plain = lambda prompt: generated(target, FakeContext(target, n_ctx=512), prompt, 24).tokens  # noqa: E731
    assert first == plain([0, 9, 8]) and second == plain([0, 2, 9, 8])
    assert before == 0 and auto.choices["history"] > 0
    assert "history" in auto.acceptance.sources


def test_a_corpus_is_drafted_from_when_the_text_itself_has_no_match():
    passage = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]
    target = FakeModel(n_vocab=16, sharpness=2.0, script=LOOPY)
    auto = METHODS["auto"].drafter(DrafterInputs(SamplingParams(), None, FLAT, history=History(corpus=[passage])))
    run_auto(auto, target, [0, 3, 4, 5], 6)
    assert auto.choices["corpus"] > 0


def test_the_suffix_automaton_finds_the_longest_earlier_match_of_the_texts_end():
    from specgen.drafting.lookup import SuffixAutomaton

    rng = np.random.default_rng(0)
    text = list(rng.integers(0, 4, 300))
    sam = SuffixAutomaton()
    for end in range(len(text)):
        sam.extend(text[end])
        prefix = text[:end + 1]
        best = 0  # brute force: the longest suffix that also ends at some earlier position
        for e in range(end):
            k = 0
            while k <= e and prefix[e - k] == prefix[end - k]:
                k += 1
            best = max(best, k)
        length, start = sam.longest_earlier()
        assert length == best
        if best:
            assert prefix[start - best:start] == prefix[end + 1 - best:]


def test_lookup_drafts_a_long_quote_even_when_its_last_ngram_recurs_often():
    """The text quotes a 30-token passage whose last 4-gram occurs many times later: the n-gram
    index's newest occurrences all follow that 4-gram elsewhere; the suffix automaton finds the quote."""
    from specgen.drafting.lookup import LookupDrafter

    common = [7, 8, 9, 10]
    quote = list(range(100, 126)) + common + [200, 201, 202]
    filler = [t for i in range(8) for t in (50 + i, *common, 60 + i)]
    lookup = LookupDrafter()
    lookup.reset([1] + quote + filler + quote[:30])
    (length, start), *_ = lookup.matches(lookup.tokens, 4)
    assert length == 30 and lookup.tokens[start:start + 3] == [200, 201, 202]


def test_cache_clear_deletes_the_store_and_a_missing_corpus_is_one_line(tmp_path):
    from clihelp import assert_one_line_error, gen, specgen

    (tmp_path / "history").mkdir()
    (tmp_path / "history" / "abc.u32").write_bytes(b"\0" * 40)
    (tmp_path / "calibration").mkdir()
    (tmp_path / "calibration" / "c.json").write_text("{}")
    proc = specgen("cache", "clear", env={"SPECGEN_HOME": str(tmp_path)})
    assert proc.returncode == 0 and "history: removed 1 files" in proc.stdout, proc.stderr
    assert not (tmp_path / "history").exists() and (tmp_path / "calibration" / "c.json").exists()
    (tmp_path / "screened").mkdir()
    (tmp_path / "screened" / "t-q8_0-head.gguf").write_bytes(b"GGUF")
    proc = specgen("cache", "clear", "--screened", env={"SPECGEN_HOME": str(tmp_path)})
    assert proc.returncode == 0 and "screened: removed 1 files" in proc.stdout, proc.stderr
    assert not (tmp_path / "screened").exists() and (tmp_path / "calibration" / "c.json").exists()
    assert_one_line_error(gen("--corpus", str(tmp_path / "missing.txt"), "hi"),
                          f"--corpus expects a text file, found '{tmp_path / 'missing.txt'}' (no such file)")


def test_earlier_texts_stay_searchable_across_index_merges_and_the_oldest_go(monkeypatch):
    import specgen.drafting.history as h

    monkeypatch.setattr(h, "NEWEST_MIN", 100)
    monkeypatch.setattr(h, "PROCESS_KEEP", 2000)
    history = History()
    texts = [[1000 + i] + [5000 + i * 10 + j for j in range(49)] for i in range(100)]  # 50 tokens each
    for text in texts:
        history.add_text(text)
    assert len(history._process) == 2 and sum(map(len, history._older)) <= 2000
    newest_kept = texts[-30]
    assert history.continuations(newest_kept[:10], 3, 4)[0].tokens == newest_kept[10:13]
    assert history.continuations(texts[-1][:10], 3, 4)[0].tokens == texts[-1][10:13]
    assert history.continuations(texts[0][:10], 3, 4) == []  # past PROCESS_KEEP: forgotten


# --- the store's format: damage is found, said once, and costs only the texts it lands in ---------


def texts_of(data):
    """The texts of a joined token array (see `join`)."""
    chunks = np.split(np.asarray(data), np.nonzero(np.asarray(data) == SEPARATOR)[0] + 1)
    return [c[:-1].tolist() for c in chunks if len(c)]


def filled(path, texts):
    store = Store(path)
    for text in texts:
        store.append(text)
    return store


def some_texts(count, length=100, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50_000, length).tolist() for _ in range(count)]


def is_clean(path):
    found = parse(path.read_bytes())
    return path.read_bytes().startswith(FILE_HEADER) and not found.damaged


def test_the_store_reads_back_what_was_appended_in_its_own_format(tmp_path, warnings):
    texts = some_texts(5) + [[7, 8], [SEPARATOR - 1] * 3]
    path = tmp_path / "h.v2.store"
    filled(path, texts)
    assert np.array_equal(Store(path).read(), join(texts)) and Store(path).read().dtype == np.uint32
    assert path.read_bytes() == FILE_HEADER + b"".join(encode(t) for t in texts)
    assert path.stat().st_size % 4 == 0 and warnings == []
    assert store_path(tmp_path, "abc") == tmp_path / "history" / "abc.v2.store"  # never an old raw .u32


def test_a_store_truncated_mid_record_keeps_the_earlier_texts_and_is_rewritten_clean(tmp_path, warnings):
    texts = some_texts(3)
    path = tmp_path / "h.v2.store"
    filled(path, texts)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 150)  # the last record loses its tail
    assert texts_of(Store(path).read()) == texts[:2]
    assert len(warnings) == 1 and str(path) in warnings[0] and "(2 texts kept)" in warnings[0]
    assert path.read_bytes() == FILE_HEADER + encode(texts[0]) + encode(texts[1])
    store = Store(path)
    assert texts_of(store.read()) == texts[:2]
    store.append([1, 2, 3])
    assert texts_of(Store(path).read()) == texts[:2] + [[1, 2, 3]] and len(warnings) == 1 and is_clean(path)


def test_random_bytes_over_the_middle_cost_only_the_texts_they_touch(tmp_path, warnings):
    texts = some_texts(10)
    path = tmp_path / "h.v2.store"
    filled(path, texts)
    size = len(encode(texts[0]))  # every record: 12 + 400 bytes
    at = len(FILE_HEADER) + 3 * size + 50  # from inside the 4th text, 1,001 bytes: the 4th to the 6th
    data = bytearray(path.read_bytes())
    data[at:at + 1001] = np.random.default_rng(1).integers(0, 256, 1001, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))
    touched = range((at - len(FILE_HEADER)) // size, (at + 1001 - len(FILE_HEADER) - 1) // size + 1)
    healthy = [t for i, t in enumerate(texts) if i not in touched]
    assert list(touched) == [3, 4, 5] and texts_of(Store(path).read()) == healthy
    assert len(warnings) == 1 and str(path) in warnings[0] and f"{3 * size:,} damaged bytes skipped" in warnings[0]
    assert "(7 texts kept)" in warnings[0] and is_clean(path)
    assert texts_of(Store(path).read()) == healthy and len(warnings) == 1  # said once: the file is clean now


def test_garbage_after_the_records_is_dropped_and_later_texts_are_found_behind_it(tmp_path, warnings):
    texts = some_texts(2)
    path = tmp_path / "h.v2.store"
    filled(path, texts)
    with open(path, "ab") as f:
        f.write(b"not a record: 37 bytes of plain text.")  # 37: what follows is misaligned
    Store(path).append([4, 5, 6])  # a writer that never read the store appends behind the garbage
    assert texts_of(Store(path).read()) == texts + [[4, 5, 6]]
    assert len(warnings) == 1 and str(path) in warnings[0] and "37 damaged bytes skipped" in warnings[0]
    assert is_clean(path)


def test_a_foreign_file_is_set_aside_and_a_new_store_started(tmp_path, warnings):
    path = tmp_path / "h.v2.store"
    junk = np.random.default_rng(2).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    path.write_bytes(junk)
    store = Store(path)
    assert len(store.read()) == 0 and not path.exists()
    assert (tmp_path / "h.v2.store.bad").read_bytes() == junk  # never deleted
    assert len(warnings) == 1 and str(path) in warnings[0] and "moved to h.v2.store.bad" in warnings[0]
    store.append([1, 2, 3])
    assert texts_of(Store(path).read()) == [[1, 2, 3]] and is_clean(path) and len(warnings) == 1


def test_a_store_whose_header_is_lost_keeps_its_texts(tmp_path, warnings):
    texts = some_texts(3)
    path = tmp_path / "h.v2.store"
    filled(path, texts)
    path.write_bytes(b"\0" * 20 + path.read_bytes()[20:])  # the header and the first record's start
    assert texts_of(Store(path).read()) == texts[1:] and not (tmp_path / "h.v2.store.bad").exists()
    assert len(warnings) == 1 and "its header among them" in warnings[0] and is_clean(path)


def test_a_crash_mid_append_loses_only_the_half_written_text(tmp_path, warnings):
    a, b, c = some_texts(3, length=64)
    path = tmp_path / "h.v2.store"
    filled(path, [a])
    with open(path, "ab") as f:
        f.write(encode(b)[:130])  # the process died inside its write
    filled(path, [c])
    assert texts_of(Store(path).read()) == [a, c]  # c never glued to the half of b
    assert len(warnings) == 1 and "130 damaged bytes skipped (2 texts kept)" in warnings[0]


def _many_writer(path, i, failed):
    store = Store(path)
    for j in range(150):
        store.append([i * 100_000 + j] * (1 + (i * 7 + j) % 40))
    failed.put(store.failed)


def test_two_writers_at_once_leave_every_text_whole(tmp_path, warnings):
    path = tmp_path / "h.v2.store"
    failed = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_many_writer, args=(path, i, failed)) for i in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert [failed.get(timeout=10) for _ in procs] == [False, False]
    texts = texts_of(Store(path).read())
    expected = [[i * 100_000 + j] * (1 + (i * 7 + j) % 40) for i in (1, 2) for j in range(150)]
    assert sorted(texts) == sorted(expected) and warnings == [] and is_clean(path)
    for i in (1, 2):  # each writer's texts in its order
        assert [t for t in texts if t[0] // 100_000 == i] == [t for t in expected if t[0] // 100_000 == i]


def test_a_cut_keeps_the_newest_whole_texts(tmp_path, warnings):
    rng = np.random.default_rng(3)
    texts = [[i] * int(rng.integers(1, 20)) for i in range(60)]
    path = tmp_path / "h.v2.store"
    store = Store(path, max_tokens=200, keep_tokens=100)
    for text in texts:
        store.append(text)
    kept = texts_of(Store(path).read())
    assert kept == texts[len(texts) - len(kept):] and kept[-1] == texts[-1]  # the newest, whole, in order
    assert sum(len(t) + 1 for t in kept) <= 200 and path.stat().st_size // 4 <= 200
    assert warnings == [] and is_clean(path)


def test_a_cut_of_a_damaged_store_keeps_its_healthy_texts(tmp_path, warnings):
    path = tmp_path / "h.v2.store"
    filled(path, [[1] * 10, [2] * 10])
    with open(path, "ab") as f:
        f.write(b"\xff" * 13)
    store = Store(path, max_tokens=40, keep_tokens=30)
    store.append([3] * 10)  # past max_tokens: cut
    assert texts_of(Store(path).read()) == [[2] * 10, [3] * 10] and is_clean(path)
    assert len(warnings) == 1 and "13 damaged bytes skipped" in warnings[0]
