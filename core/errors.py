"""Error types every layer raises and the CLI turns into exit code 2 (the message names the key, file or line)."""


class ConfigError(ValueError):
    """A config problem the user must fix; the message names the key and, when known, the file."""


class CorpusError(ValueError):
    """Raised when a corpus file is missing, malformed or empty; the message names the file and line."""
