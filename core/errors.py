"""Errors trajlake reports. Every one carries a message a user can act on (the CLI prints it as one line)."""


class TrajlakeError(Exception):
    """Base of every error trajlake reports as one readable line (the CLI prints it without a traceback)."""


class SchemaError(TrajlakeError):
    """Data handed to the store does not match a table's schema; nothing was written."""


class LakeLockedError(TrajlakeError):
    """A DuckDB-file catalog is already open in another process."""


class SnapshotError(TrajlakeError):
    """A snapshot that does not exist or predates the store's tables was asked for."""


class CatalogError(TrajlakeError):
    """The catalog URI is malformed or its backend cannot be reached."""
