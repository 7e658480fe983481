"""The `trajlake` command: one typer app (cli.app) with its commands grouped by module."""

from trajlake.cli.app import app, main

__all__ = ["app", "main"]
