"""An import run's settings, as stored in `runs.config`, and what identifies the run among them.

An import is its files' contents read with one tokenizer, as one policy, env and split: a run id given again with
other files (or another tokenizer, policy, env or split) would merge two datasets under one identity, and one
stored as another kind of run (a collect run, say) would take in episodes it never played. Both are refused,
with nothing written, as a resumed collect or train run with other settings is (store/runs.py). Where the files
lie and how they are chunked are operational: the same files moved, or imported again in other chunks, are the
same run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trajlake.core.config_types import operational, setting
from trajlake.store import runs


@dataclass(frozen=True)
class ImportConfig:
    """What an import run was made from (stored as the run's config, the keys every import run has had)."""

    importer: str = setting(help="The importer that read the files (`agentgym`).")
    files: tuple[dict[str, Any], ...] = setting(help=(
        "Each input file: its `path`, `sha256` and `rows`. The contents identify the run (the sorted sha256s), not "
        "the paths."))
    tokenizer_fingerprint: str = setting(help=(
        "The tokenizer's fingerprint (collect/chat.py): the stored token ids depend on it."))
    policy_id: str = setting(help="The policy the imported episodes are stored as played by.")
    env: str | None = setting(help="The env given for every row (else each row's own).")
    split: str | None = setting(help="The split given for every task (else each row's own, or its file's name).")
    tokenizer: str = operational("", help=(
        "Where the tokenizer was loaded from (its folder, or the loaded tokenizer's name)."))
    chunk_size: int = operational(256, help="Episodes per snapshot.")

    def differences(self, stored: dict[str, Any]) -> list[runs.Difference]:
        """(field, stored value, given value) for each identifying setting this import differs in from the
        `stored` config of the run it would add to; files compare by their contents (sorted sha256s)."""
        def adjust(name: str, old: Any, new: Any) -> tuple[Any, Any]:
            if name == "files":
                return sorted(f.get("sha256") for f in old or []), sorted(f["sha256"] for f in new)
            return old, new

        return runs.differences(stored, self, adjust=adjust, order=("files",))
