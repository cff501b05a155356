"""User-facing errors: each message is one line naming what was expected and what was found."""


class SpecgenError(Exception):
    """An error caused by input or environment; the CLI prints it as one line and exits non-zero."""

    exit_code = 1


class ModelError(SpecgenError):
    """A model file, manifest entry or download is missing, corrupt or unsupported."""


class ConfigError(SpecgenError):
    """A YAML config or a command-line option is invalid."""

    exit_code = 2


class PromptError(SpecgenError):
    """A prompt or prompt file is empty, unreadable or malformed."""

    exit_code = 2


class ConstraintError(SpecgenError):
    """A JSON schema, grammar or response format that cannot be compiled or is not supported, or that
    cannot go on mid-answer (a limit of the grammar engine; logit_bias banning all it allows)."""

    exit_code = 2
