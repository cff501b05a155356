"""The draft that llama.cpp's draft modes load in `specgen bench --llama-cpp`, and what a GGUF is made of.

A draft whose vocabulary specgen cut (`-d self` keeps the tokens the target uses most, and maps
them back to the target's ids itself) is a GGUF llama.cpp cannot pair with its target. Dropping
llama.cpp's draft modes then would compare specgen with a draft against llama.cpp without one, so
those modes get the best draft llama.cpp can load: the same derivation with its whole vocabulary
(the target quantized to the cut draft's type, its embedding/output matrix in the cut draft's
type), made once (seconds) and cached beside the derived drafts. `--llama-cpp-draft MODEL` names
another (e.g. gemma-3-270m-q2_k). Either way the row's name says which draft it ran with, e.g.
"llama.cpp draft-simple (-d self, whole vocabulary)", and `--json` records its sha256.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specgen.models.manifest import describe, drafts_dir, remembered_sha256
from specgen.app.session import Session
from specgen.core.vocab import SUBSET_IDS_KEY
from specgen.errors import ModelError, SpecgenError
from specgen.llama.gguf_header import read_header
from specgen.reporter import reporter

WHOLE = "-d self, whole vocabulary"


@dataclass(frozen=True)
class LlamaCppDraft:
    path: Path
    label: str  # what the row's name adds: the draft it loaded
    record: dict  # models.llama_cpp_draft in --json: name, path, sha256, why, and gguf_facts


def gguf_facts(path: Path) -> dict:
    """A GGUF's quantization type (llama.cpp's file type), its embedding/output matrix's type, its
    vocabulary size, and whether specgen cut that vocabulary (read from the header; {} where the
    file cannot be read as a GGUF)."""
    import gguf

    try:
        header = read_header(path, ("general.file_type",), tensors=True)
    except ModelError as e:
        reporter().warn(f"{e}: its type is not recorded")
        return {}
    code = header.values.get("general.file_type")
    file_type = None
    if code is not None:
        try:
            file_type = gguf.LlamaFileType(int(code)).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            file_type = str(int(code))
    head = header.tensor_types.get("token_embd.weight")
    return {"file_type": file_type, "head_type": gguf.GGMLQuantizationType(head).name if head is not None else None,
            "n_vocab": header.counts.get("tokenizer.ggml.tokens"), "vocabulary_cut": SUBSET_IDS_KEY in header.keys}


def whole_vocabulary(cut: Path, target: Path) -> Path:
    """The cut draft `cut` (derived from `target`) with its whole vocabulary: `target` quantized as
    the cut draft was. Cached by the cut draft's sha256; a one-line SpecgenError where its type is
    not one specgen can quantize to."""
    from specgen.llama import tools

    facts = gguf_facts(cut)
    ftype, head = facts.get("file_type"), facts.get("head_type")
    if ftype not in tools._FTYPES:
        raise SpecgenError(f"cannot give llama.cpp the whole-vocabulary form of {cut.name}: its type {ftype} is not "
                           f"one specgen quantizes to ({', '.join(tools._FTYPES)})")
    head = head if head in tools.HEAD_TYPES else None  # else the type's own choice, as the derivation made
    dst = drafts_dir() / f"{target.stem}-{ftype.lower()}-{head or 'auto'}-whole-{remembered_sha256(cut)[:12]}.gguf"
    if dst.is_file():
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".tmp")
    with reporter().spinner(f"llama.cpp cannot load a vocabulary-cut draft: quantizing {target.name} to {ftype}"
                            f"{f' (embedding/output {head})' if head else ''} for its draft modes"):
        tools.quantize(target, tmp, ftype, head_type=head)
    tmp.replace(dst)
    return dst


def for_llama_cpp(session: Session, given: str | None = None) -> LlamaCppDraft | None:
    """The draft llama.cpp's draft modes load: `given` (a path or models.txt name), else the
    bench's draft, else (a vocabulary-cut draft) its whole-vocabulary form; None without a draft."""
    if given is not None:
        from specgen.models.resolve import resolve

        path = resolve(given)
        return LlamaCppDraft(path, Path(given).stem if path == Path(given).expanduser() else given,
                             {**describe(given, path), "why": "--llama-cpp-draft", **gguf_facts(path)})
    draft = session.draft
    if draft is None:
        return None
    own = Path(draft.path)
    if draft.subset_of_target is None:
        return LlamaCppDraft(own, str(session.draft_label), {**describe(str(session.draft_label), own),
                                                            "why": "the bench's draft",
                                         **gguf_facts(own)})
    target = Path(session.target.source_path)
    path = whole_vocabulary(own, target)
    return LlamaCppDraft(path, WHOLE, {"name": f"{session.draft_label} ({WHOLE})", "path": str(path),
                                       "sha256": remembered_sha256(path),
                                       "why": "llama.cpp cannot load the bench's vocabulary-cut draft: the same "
                                              "derivation with its whole vocabulary", **gguf_facts(path)})
