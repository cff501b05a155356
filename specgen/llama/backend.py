"""The only module that imports llama_cpp: models, contexts, multi-sequence batches, KV by sequence id.

Contexts are built with the low-level API because the high-level `Llama()` exposes neither
`n_seq_max` nor `kv_unified`, which tree verification needs (every branch of a token tree is a
sequence id; siblings share positions, so the KV cache is edited by sequence id, never by position
alone).
"""

from __future__ import annotations


import ctypes
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

import llama_cpp as L

from specgen.core.kv import INVARIANT_ROWS
from specgen.core.protocol import Batch, LogitsPatch, SubsetMap, VocabInfo
from specgen.core.vocab import SUBSET_IDS_KEY, SUBSET_UNK_KEY

if TYPE_CHECKING:
    from specgen.core.constraint import Constraint, ConstraintSpec
    from specgen.llama.embed import Embedder
from specgen.errors import ModelError, SpecgenError
from specgen.llama.runtime import init as _init, last_error as _last_error
from specgen.llama.gguf_header import read_header
from specgen import host
from specgen.host import default_threads

GGUF_MAGIC = b"GGUF"



def check_gguf_file(path: Path) -> None:
    """Fail with one clear line unless `path` is a readable file that starts like a GGUF."""
    if not path.exists():
        raise ModelError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelError(f"expected a GGUF model file, got a directory: {path}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelError(f"cannot read model file {path}: {e.strerror}") from None
    if magic != GGUF_MAGIC:
        raise ModelError(f"not a GGUF file: {path} (expected magic bytes 'GGUF', found {magic!r})")


# Weight types (GGUF general.file_type) whose prompts specgen's kernels read at least as fast in
# decodes of INVARIANT_ROWS as llama.cpp's kernels read them in decodes of n_batch, with the kernel that
# must be on (a K-quant mix by its main type): every type measured on 2026-11-29 (docs/serve.md), but
# F16 and F32 only with the AVX-512 f16x16/f32x16 (an AVX2 build read them 1.36x and 1.43x slower).
FEW_COLUMN_PROMPTS = {"0": "f32x16", "1": "f16x16", "2": "q4_0", "3": "q4_1", "7": "q8_0", "8": "q5_0",
                      "9": "q5_1", "10": "q2_k", "11": "q3_k", "12": "q3_k", "13": "q3_k", "14": "q4_k",
                      "15": "q4_k", "16": "q5_k", "17": "q5_k", "18": "q6_k"}


def prompt_chunk(file_type: str | None, system_info: str, gpu_layers: int) -> int | None:
    """The decode size a prompt is read in without a prompt cache: INVARIANT_ROWS where specgen's
    kernel for the model's weights is on and faster at it (above), on the CPU; None (n_batch)
    otherwise. Those decodes also give each token the bits a prompt cache's decodes give it."""
    kernel = FEW_COLUMN_PROMPTS.get(file_type or "")
    if kernel is None or gpu_layers != 0 or "SPECGEN_INVARIANT = on" not in system_info:
        return None
    kernels = system_info.split("SPECGEN_KERNELS = ", 1)[-1].split("|", 1)[0].split(":", 1)[-1].split()
    return INVARIANT_ROWS if kernel in kernels else None


class LlamaModel:
    """A loaded GGUF model (weights and vocabulary); contexts are made from it."""

    def __init__(self, path: str | Path, gpu_layers: int = 0, screen: LogitsPatch | None = None):
        _init()
        self.path = str(path)
        # A screened copy of a target (screen.py): its contexts patch each logits row's possible
        # argmax tokens with their exact logits, for greedy decoding only.
        self.screen = screen
        self.source_path = self.path  # a screened copy's: the target it was made from
        check_gguf_file(Path(path))
        params = L.llama_model_default_params()
        params.n_gpu_layers = self.gpu_layers = gpu_layers
        self._model = L.llama_model_load_from_file(self.path.encode(), params)
        if not self._model:
            detail = _last_error()
            raise ModelError(f"llama.cpp could not load {self.path} (truncated, corrupt or unsupported "
                             f"GGUF){': ' + detail if detail else ''}")
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab: int = L.llama_vocab_n_tokens(self._vocab)
        self.n_ctx_train: int = L.llama_model_n_ctx_train(self._model)
        self.n_embd: int = L.llama_model_n_embd(self._model)
        self.bos: int = L.llama_vocab_bos(self._vocab)
        self.eos: int = L.llama_vocab_eos(self._vocab)
        self.name: str = self.meta("general.name") or Path(self.path).stem
        # Recurrent/hybrid models cannot drop part of a sequence, which rejected drafts need.
        self.can_rollback = not (L.llama_model_is_recurrent(self._model) or L.llama_model_is_hybrid(self._model))
        self.subset_of_target = self._subset_map()
        template = L.llama_model_chat_template(self._model, None)
        self.chat_template: str | None = template.decode("utf-8", errors="replace") if template else None
        self._pieces: dict[int, bytes] = {}
        self.prompt_chunk = prompt_chunk(self.meta("general.file_type"),
                                         L.llama_print_system_info().decode(errors="replace"), gpu_layers)

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = L.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    def _subset_map(self) -> SubsetMap | None:
        """A vocabulary-subset draft's map to its target's ids, from the GGUF's specgen.* metadata
        (read from the header: llama.cpp's metadata API renders arrays as text)."""
        unk = self.meta(SUBSET_UNK_KEY)
        if unk is None:
            return None
        ids = read_header(self.path, (SUBSET_IDS_KEY,)).values.get(SUBSET_IDS_KEY)
        return SubsetMap(np.asarray(ids if ids is not None else [], dtype=np.int64), int(unk))

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (L.llama_token * n_max)()
        n = L.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            n_max = -n
            buf = (L.llama_token * n_max)()
            n = L.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for (special tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            n = L.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = L.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
            cached = self._pieces[token] = buf.raw[:n]
        return cached

    def token_text(self, token: int) -> bytes:
        """The vocabulary's own text for a token (special tokens included), for vocab checks."""
        text = L.llama_vocab_get_text(self._vocab, token)
        return text or b""

    def is_eog(self, token: int) -> bool:
        return bool(L.llama_vocab_is_eog(self._vocab, token))

    def vocab_info(self, sample_ids: Sequence[int]) -> VocabInfo:
        samples = tuple((i, self.token_text(i)) for i in sample_ids if 0 <= i < self.n_vocab)
        return VocabInfo(L.llama_vocab_type(self._vocab), self.n_vocab, self.bos, self.eos, samples)

    def format_chat(self, messages: list[dict], tools: list[dict] | None = None, **variables) -> str:
        """Render messages with the GGUF's own Jinja chat template (llama-cpp-python's formatter);
        `tools` (OpenAI's shape) as the template's `tools` variable; `variables`: more of the
        template's own (a request's chat_template_kwargs, e.g. enable_thinking)."""
        if not self.chat_template:
            raise ModelError(f"--chat needs a chat template, but {Path(self.path).name} has none "
                             "(use --no-chat)")
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        fmt = Jinja2ChatFormatter(self.chat_template, eos_token=self.token_text(self.eos).decode(errors="replace"),
                                  bos_token=self.token_text(self.bos).decode(errors="replace"))
        try:
            return fmt(messages=messages, tools=tools, **variables).prompt
        except Exception as e:  # templates raise their own errors (e.g. role order)
            raise ModelError(f"the chat template of {Path(self.path).name} rejected the messages: {e}") from None

    @property
    def vocab_ptr(self):
        """llama.cpp's vocabulary object (llguidance builds its tokenizer from it)."""
        return self._vocab

    def constrain(self, spec: "ConstraintSpec") -> "Constraint":
        """A matcher for `spec` over this vocabulary (llama/grammar.py; ConstraintError if refused)."""
        from specgen.llama.grammar import GuidanceConstraint

        return GuidanceConstraint(self, spec)

    def embedder(self, n_ctx: int, n_threads: int | None = None) -> "Embedder":
        """A second context that embeds texts of up to `n_ctx` tokens (llama/embed.py; ModelError if
        this model cannot embed)."""
        from specgen.llama.embed import Embedder

        return Embedder(self, n_ctx, n_threads)

    def new_context(self, n_ctx: int, n_seq_max: int = 1, n_batch: int = 512,
                    n_threads: int | None = None, n_outputs: int = 1) -> "LlamaContext":
        return LlamaContext(self, n_ctx, n_seq_max, n_batch, n_threads, n_outputs)

    def close(self) -> None:
        if getattr(self, "_model", None):
            L.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # at interpreter exit the bindings, or this module's globals, may be gone first
            pass


LLAMA_MAX_SEQ = 256  # llama.cpp's limit on n_seq_max (llama-cparams.h)
THREAD_CHECK_S = 0.5  # how often a context without fixed threads looks at the other processes
FREE_CORE_MARGIN = 0.3  # a core another process uses less than this much still counts as free


class LlamaContext:
    """A llama.cpp context whose KV cache is shared by up to `n_seq_max` sequences (kv_unified),
    with room for `n_outputs` rows of logits from the start."""

    def __init__(self, model: LlamaModel, n_ctx: int, n_seq_max: int = 1, n_batch: int = 512,
                 n_threads: int | None = None, n_outputs: int = 1, eval_callback=None):
        self.model = model
        threads = n_threads or default_threads()
        params = L.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = n_batch
        # llama.cpp sizes its logits buffer at n_seq_max rows, then reallocates and clears the
        # whole buffer inside each decode that needs more rows than ever before: with gemma's
        # 262k vocabulary, 23 ms for 48 rows and 29 for 64, each paid again by the next larger
        # tree (a cold 128-token run of q321 decoded in 576 ms against 557 with the room
        # reserved). Asking for the sequences reserves the rows once, when the context is made.
        params.n_seq_max = min(LLAMA_MAX_SEQ, max(n_seq_max, n_outputs))
        params.kv_unified = True  # without it each sequence only gets n_ctx / n_seq_max cells
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        # A model kept on the CPU stays there: in a GPU build llama.cpp would run the products of
        # a decode of 32+ tokens (a verification tree) on the GPU (its op offload), which rounds
        # otherwise than the one-token decode that specgen's CPU kernels make each row equal.
        params.op_offload = model.gpu_layers > 0
        self.screen = model.screen
        if self.screen is not None:  # each output row's hidden state too, room reserved now
            params.embeddings, params.pooling_type = True, L.LLAMA_POOLING_TYPE_NONE
        self._embeddings = self.screen is not None
        self._sampler = None  # how the rows will be chosen (screened rows are exact where that needs)
        if eval_callback is not None:  # called around each graph node (profile.py); kept alive with the context
            params.cb_eval, self._eval_callback = eval_callback, eval_callback
        self._ctx = L.llama_init_from_model(model._model, params)
        if not self._ctx:
            raise SpecgenError(f"llama.cpp could not create a context of {n_ctx} tokens for "
                               f"{Path(model.path).name}: {_last_error() or 'out of memory?'}")
        self.n_ctx: int = L.llama_n_ctx(self._ctx)
        self.n_seq_max = n_seq_max
        # llama.cpp may adjust both (n_ctx is padded, n_batch capped by n_ctx): use what it chose.
        self.n_batch = min(n_batch, L.llama_n_batch(self._ctx), L.llama_n_ubatch(self._ctx))
        self.n_threads = self.max_threads = threads
        # Threads not given: follow the cores other processes leave free (see _follow_free_cores).
        self.adaptive = n_threads is None
        self._cpu_seen, self._next_check = None, 0.0
        self.n_vocab = model.n_vocab
        self.prompt_chunk = model.prompt_chunk  # kv.prefill's decode size without a prompt cache
        self.columns = None
        self._mem = L.llama_get_memory(self._ctx)
        # Cells the decodes took since the last clear(): specgen's build never moves the cache's head
        # back (build.py), so until it wraps around this is where the next token lands (kv.py).
        self.cells_written = 0
        self._batch = L.llama_batch_init(self.n_batch, 0, n_seq_max)

    def choose_with(self, sampler) -> None:
        """The generation's choice rule (core/sampling.Sampler): a screened row is made exact where
        it decides (screen.ScreenedHead.patch); without it, where the argmax does."""
        self._sampler = sampler

    def decode(self, batch: Batch) -> np.ndarray:
        """One `llama_decode`; returns the logits rows of the tokens with logits=True, in order.

        The rows are a read-only view of llama.cpp's output buffer (copying 1 MB per row of a
        262k vocabulary costs more than the work done with it): valid until the next decode on
        this context; copy what you keep.
        """
        n = len(batch)
        if n == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        if self.adaptive and time.monotonic() >= self._next_check:
            self._follow_free_cores()
        if n > self.n_batch:
            raise ValueError(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        b = self._batch
        b.n_tokens = n
        for i in range(n):
            b.token[i] = batch.tokens[i]
            b.pos[i] = batch.positions[i]
            ids = batch.seq_ids[i]
            b.n_seq_id[i] = len(ids)
            row = b.seq_id[i]
            for j, s in enumerate(ids):
                row[j] = s
            b.logits[i] = batch.logits[i]
        n_out = batch.n_outputs
        if self.screen is not None and self._embeddings != (n_out > 0):
            # With embeddings on llama.cpp outputs every row: a prompt's rows ask for none.
            self._embeddings = n_out > 0
            L.llama_set_embeddings(self._ctx, self._embeddings)
        rc = L.llama_decode(self._ctx, b)
        self.cells_written += n
        if rc == 1:
            raise SpecgenError(f"the context is full ({self.n_ctx} tokens): use a larger --ctx")
        if rc != 0:
            raise SpecgenError(f"llama_decode failed with code {rc}: {_last_error()}")
        # llama_get_logits: the requested rows, contiguous, in batch order.
        ptr = L.llama_get_logits(self._ctx)
        if self.screen is None or n_out == 0:
            out = np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab))
        else:  # every row was output (see above); keep the asked-for ones, exact where it counts
            out = np.ctypeslib.as_array(ptr, shape=(n, self.n_vocab))
            hidden = np.ctypeslib.as_array(L.llama_get_embeddings(self._ctx), shape=(n, self.model.n_embd))
            asked = np.flatnonzero(batch.logits)
            if n_out < n:
                out, hidden = out[asked], hidden[asked]
            # Each row chooses the token after its own: the race there (see choose_with).
            self.screen.patch(out, hidden, np.asarray(batch.positions)[asked] + 1, self._sampler)
        out.flags.writeable = False
        return out

    def _follow_free_cores(self) -> None:
        """Use as many threads as other processes leave cores free (at most the configured ones).

        llama.cpp's CPU threads meet at a barrier after every operation of the graph, spinning
        while they wait: with a thread per core and a CPU-bound process beside us, the thread
        that gets descheduled holds the others for a scheduler slice at each barrier. Measured
        on 2 cores with one busy: one decode of 8 tokens of gemma Q4_K_M took 75-208 ms with 2
        threads and 70 ms with 1; one token, 16-135 ms against 11.5 ms. Checked every
        THREAD_CHECK_S from /proc/stat (what other processes used meanwhile)."""

        self._next_check = time.monotonic() + THREAD_CHECK_S
        now = host.cpu_sample()
        others = host.others_cores(self._cpu_seen, now)
        self._cpu_seen = now
        if others is None:
            return
        cores = default_threads()
        wanted = max(1, min(self.max_threads, math.floor(cores - others + FREE_CORE_MARGIN)))
        if wanted != self.n_threads:
            L.llama_set_n_threads(self._ctx, wanted, wanted)
            self.n_threads = wanted

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        # Called directly: llama-cpp-python's LlamaContext.kv_cache_seq_rm turns seq -1 into 0.
        return bool(L.llama_memory_seq_rm(self._mem, seq_id, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        L.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        L.llama_memory_seq_keep(self._mem, seq_id)

    def clear(self) -> None:
        L.llama_memory_clear(self._mem, True)
        self.cells_written = 0

    def seq_pos_min(self, seq_id: int) -> int:
        """The smallest position `seq_id` holds (-1: none): once its head comes round, a sliding-window
        cache reuses cells its window left, dropping their positions (kv.holds_from_start)."""
        return L.llama_memory_seq_pos_min(self._mem, seq_id)

    def seq_save(self, seq_id: int) -> bytes | None:
        """Sequence `seq_id`'s KV cells, in cell order (llama.cpp's per-sequence state); None where
        a restore could not put them back where a cold prefill does: a sliding-window or
        recurrent model's memory is not one cell per position in order."""
        m = self.model._model
        if L.llama_model_n_swa(m) > 0 or L.llama_model_is_recurrent(m) or L.llama_model_is_hybrid(m):
            return None
        size = L.llama_state_seq_get_size(self._ctx, seq_id)
        buf = (ctypes.c_uint8 * size)()
        n = L.llama_state_seq_get_data(self._ctx, buf, size, seq_id)
        return memoryview(buf).cast("B")[:n].tobytes() if n else None  # (buf[:n] would be a list of ints)

    def seq_load(self, seq_id: int, state: bytes, n_cells: int) -> bool:
        """Empty the cache, then put back a seq_save()d sequence: with every cell free and the head at
        0, llama.cpp places its cells from cell 0 in their saved order (find_slot), where a cold
        prefill of the same tokens puts them. False (the cache left empty) where llama.cpp refused."""
        self.clear()
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if not L.llama_state_seq_set_data(self._ctx, buf, len(state), seq_id):
            self.clear()
            return False
        self.cells_written = n_cells
        return True

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            L.llama_batch_free(self._batch)
            L.llama_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # at interpreter exit the bindings, or this module's globals, may be gone first
            pass


