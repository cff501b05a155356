"""At interpreter exit Python may collect a model or context after the modules it uses were torn down
(their globals set to None): its __del__ must then do nothing, not print "Exception ignored in ...
__del__" with a traceback under the output of a command that finished."""

import pytest

from specgen.llama import backend, embed


@pytest.mark.parametrize("cls,handle", [(backend.LlamaModel, "_model"), (backend.LlamaContext, "_ctx"),
                                        (embed.Embedder, "_ctx")])
def test_del_after_module_teardown_is_silent(monkeypatch, cls, handle):
    obj = cls.__new__(cls)  # a handle that was never llama.cpp's: close() must not reach llama.cpp
    setattr(obj, handle, 1)
    setattr(obj, "_batch", None)
    for module in (backend, embed):
        for name in ("contextlib", "L"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, None)
    try:
        obj.__del__()
    finally:
        setattr(obj, handle, None)  # so that the collector's own call, after the test, has nothing to free
