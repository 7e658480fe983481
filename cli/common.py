"""What every `trajlake` command shares: the global options' state, how a command opens the lake, and the
checks every command's arguments get at the edge (before any lake is opened or anything is written)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from trajlake.core.errors import TrajlakeError
from trajlake.core.ids import check_id

if TYPE_CHECKING:
    from typer.core import TyperCommand

    from trajlake.store import Lake


class State:
    lake_uri: Optional[str] = None
    debug: bool = False


def one_command(name: str, fn) -> TyperCommand:
    """`fn` as the click command `name`, made now: the commands cli/app.py makes only when they are run."""
    one = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    one.command(name)(fn)
    return typer.main.get_command(one)


def open_lake(*, read_only: bool = False) -> Lake:
    """The --lake lake; read commands open it read-only (they never create or change a lake)."""
    from trajlake.store.lake import Lake  # the store's modules load with the first command that opens a lake

    return Lake.open(State.lake_uri, read_only=read_only)


def check_output(lake: Lake, path: Path, what: str) -> Path:
    """`store.outputs.check_output_path` for a command's output next to the open `lake`: nowhere inside it, under
    any name."""
    from trajlake.store.outputs import check_output_path

    return check_output_path(lake.catalog, path, what)


def check_lake_output(path: Path, what: str) -> Path:
    """`store.outputs.check_output_path` for a command that writes a file or folder without opening the lake
    (`model ... --out`): checked against the lake --lake (or its default) names, which need not exist yet."""
    from trajlake.store.outputs import check_output_path
    from trajlake.store.uri import parse_uri

    return check_output_path(parse_uri(State.lake_uri), path, what)


def run_id_arg(param: typer.CallbackParam, value: str | list[str] | None) -> str | list[str] | None:
    """The typer callback of every option or argument that names a run id (or several): `ids.check_id` at the
    edge, before any lake is opened, one line naming the option (exit 1, as for every bad value). An id
    taken as given reached lease rows, SQL parameters and messages: empty, `../..`, 10k characters, a newline."""
    opts = [o for o in param.opts if o.startswith("-")]
    name = max(opts, key=len) if opts else "run id"
    for one in value if isinstance(value, list | tuple) else [value]:
        check_id(one, name)
    return value


#: C0 and C1 controls and DEL: in a file name they are never meant, and echoed to a terminal they can rewrite it
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def path_arg(value: str | Path) -> Path:
    """A path argument as typer's `parser`: an empty one is refused (Path("") is ".", so `--out ""`, say from
    an unset shell variable, wrote a report or a model into the current folder, and `import agentgym ""`
    read every file under it), and so is one holding a control character (NUL made the OS calls raise, and
    a newline or escape in a name is a trap for whoever lists the folder)."""
    if isinstance(value, Path):  # a default
        return value
    if not value.strip():
        raise typer.BadParameter("empty path: give a file or folder name")
    if _CONTROL.search(value):
        raise typer.BadParameter(f"path {value!r} holds a control character")
    return Path(value)


#: the metavar of path options (typer shows a parser's type as `<Path>` otherwise)
PATH = "PATH"


def check_port(port: int) -> int:
    """A TCP port to listen on, as serve-env checks it: the socket layer raised OverflowError outside 0..65535."""
    if not 0 <= port <= 65535:
        raise TrajlakeError(f"port must be 0..65535 (0: a free one), got {port}")
    return port


def check_count(option: str, value: int | None, low: int, high: int, why: str = "") -> int | None:
    """`value` if within [low, high] (None passes); else one line naming the option and the bounds."""
    if value is None:
        return None
    if value < low:
        raise TrajlakeError(f"{option} must be >= {low}, got {value}")
    if value > high:
        raise TrajlakeError(f"{option} must be at most {high:_}{why}, got {value}")
    return value


def check_finite(option: str, value: float, low: float = 0.0) -> float:
    """`value` if finite and >= low; else one line (NaN passes no comparison, so it is tested first)."""
    if not math.isfinite(value) or value < low:
        raise TrajlakeError(f"{option} must be a finite number >= {low:g}, got {value}")
    return value


def check_text(option: str, value: str | None) -> str | None:
    """A text option that names something (a host, an env, a split): not empty, no control characters."""
    if value is None:
        return None
    if not value.strip():
        raise TrajlakeError(f"{option} must not be empty")
    if _CONTROL.search(value):
        raise TrajlakeError(f"{option} {value!r} holds a control character")
    return value


def one_line(text: str) -> str:
    """An error message as one terminal line: line breaks and tabs become spaces (a multi-line message from a
    library or an env server made several lines), other control characters are shown escaped (an ESC from
    data echoed raw could rewrite the terminal)."""
    text = " ".join(str(text).split())
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
