"""Stop strings, one rule for every edge (the command line's --stop, a config file's `stop`, the
server's `stop` field): the text ends just before the first stop string it contains, that string
not shown, the finish reason "stop"; while the text's end may still be the start of a stop string,
that much is held back, so that nothing streamed is ever cut later."""

from __future__ import annotations

import json
from typing import Any

from specgen.errors import ConfigError

STOPS_MAX = 16  # stop strings one generation may have
STOP_CHARS_MAX = 256  # characters in one stop string


class StopText:
    """Text as it may be shown: never a stop string, and a piece that may begin one held back until
    the next pieces decide. `text` is the text so far (cut before the stop string once `hit`),
    `sent` how much of it was released, `word` the stop string that ended it."""

    def __init__(self, stops: tuple[str, ...] = ()):
        self.stops, self.text, self.sent, self.hit = tuple(stops), "", 0, False
        self.word = ""  # the stop string that ended the text

    def feed(self, piece: str) -> str:
        """Add a piece of generated text; what of the text may be shown now (after a hit: nothing more)."""
        if self.hit:
            return ""
        self.text += piece
        if not self.stops:
            return self.flush()
        start = max(0, self.sent - max(len(s) for s in self.stops))
        found = [(i, s) for i, s in ((self.text.find(s, start), s) for s in self.stops) if i >= 0]
        if found:
            at, self.word = min(found, key=lambda f: f[0])
            self.text, self.hit = self.text[:at], True
            return self.flush()
        held = max((k for s in self.stops for k in range(1, len(s)) if self.text.endswith(s[:k])), default=0)
        out, self.sent = self.text[self.sent:len(self.text) - held], max(self.sent, len(self.text) - held)
        return out

    def flush(self) -> str:
        """The text held back, released (the text has ended, and no stop string in it)."""
        out, self.sent = self.text[self.sent:], len(self.text)
        return out


def stops_of(value: Any, name: str = "--stop") -> tuple[str, ...]:
    """Stop strings as a command line or a config file gives them (one string, or a list of them;
    None: none), checked: each non-empty text of at most STOP_CHARS_MAX characters, at most
    STOPS_MAX of them. A ConfigError names `name`, what it expects and what it found."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
        raise ConfigError(f"{name} expects text or a list of texts, found {_shown(value)}")
    if len(items) > STOPS_MAX:
        raise ConfigError(f"{name} expects at most {STOPS_MAX} stop strings, found {len(items)}")
    for s in items:
        if not s:
            raise ConfigError(f"{name} expects a non-empty stop string, found an empty one")
        if len(s) > STOP_CHARS_MAX:
            raise ConfigError(f"{name} expects a stop string of at most {STOP_CHARS_MAX} characters, "
                              f"found {len(s)} ({_shown(s[:20])}...)")
    return tuple(dict.fromkeys(items))  # the same string twice is one stop string


def _shown(value: Any) -> str:
    """`value` as JSON writes it (a config file's, a request's), on one line and cut short."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
