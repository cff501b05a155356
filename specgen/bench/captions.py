"""The parts of a results table's caption every bench page shares: when and from which code, and on
what machine (its load always from the file, so no prose beside a table has to say it)."""

from __future__ import annotations

CPU_FEATURES = ("AVX512", "AVX2", "NEON")


def run_caption(run: dict) -> str:
    """The date and the commit, with the files it had changed when the run was taken."""
    commit = run.get("commit")
    code = (f"commit {commit[:10]}" + (f" (with changes to {', '.join(run['modified'])})" if run.get("modified") else "")
            if commit else "commit not recorded")
    return f"{(run.get('date') or 'date not recorded')[:10]} · {code}"


def machine_caption(machine: dict) -> str:
    info = (machine.get("llama_cpp") or {}).get("system_info", "")
    features = next((f for f in CPU_FEATURES if f"{f} = 1" in info), None)
    cpu = machine.get("cpu") or "unknown CPU"
    others = machine.get("others_cores")
    # Always from the file, quiet or not, so that no prose beside the table has to say it.
    busy = f" (other processes used {others:.2f} of its {machine.get('cores', '?')} cores meanwhile)" \
        if isinstance(others, (int, float)) else " (other processes' load not recorded)"
    build = (machine.get("llama_cpp") or {}).get("llama_cpp_python")
    return (f"{cpu}{f' ({features})' if features else ''}, {machine.get('cores', '?')} cores, "
            f"{machine.get('threads', '?')} thread{'' if machine.get('threads') == 1 else 's'}, "
            f"{machine.get('backend', '?')}{busy}"
            f"{f', llama.cpp of llama-cpp-python {build}' if build else ''}")
