"""Deliberate damage to a checkpoint that still *verifies*: the state file is
rewritten in the keyed-state format and the metadata re-signed, as a bug in
the runtime (not a torn write) would leave it. Validation must see it."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import struct
from collections.abc import Callable
from typing import Any

from eddyflow.offline.checkpoint import keyed_files, open_checkpoint, read_keyed_file
from eddyflow.state.storage import METADATA, _checksum_of

_LEN = struct.Struct(">Q")

Entry = tuple[int, str, Any, Any]  # key group, state, key, value


def rewrite_state(chk: str, operator: str,
                  change: Callable[[list[Entry]], list[Entry]]) -> None:
    """Replace ``operator``'s keyed state in checkpoint folder ``chk`` by
    ``change(entries)``, subtask file by subtask file, keeping it valid."""
    ref = open_checkpoint(chk)
    meta = ref.meta
    for kf in keyed_files(ref, operator):
        entries = change(list(read_keyed_file(kf)))
        groups: dict[int, list[tuple[str, Any, Any]]] = {}
        for kg, name, key, value in entries:
            groups.setdefault(kg, []).append((name, key, value))
        data = b""
        index: dict[str, list[int]] = {}
        for kg in sorted(groups):
            body = pickle.dumps((kg, groups[kg]), protocol=pickle.HIGHEST_PROTOCOL)
            index[str(kg)] = [len(data), _LEN.size + len(body)]
            data += _LEN.pack(len(body)) + body
        with open(os.path.join(ref.root, kf.handle.path), "wb") as f:
            f.write(data)
        handle = {"path": kf.handle.path, "size": len(data),
                  "sha256": hashlib.sha256(data).hexdigest()}
        part = meta["operators"][operator]["subtasks"][str(kf.subtask)]["keyed"]
        part.update(file=handle, index=index, entries=len(entries))
        meta["files"] = [handle if f["path"] == kf.handle.path else f for f in meta["files"]]
    meta["checksum"] = _checksum_of(meta)
    with open(os.path.join(ref.path, METADATA), "w") as f:
        json.dump(meta, f)


def change_one_drop_one(operator_state: str, changed: Any, dropped: Any
                        ) -> Callable[[list[Entry]], list[Entry]]:
    """Add 1 to ``changed``'s value of state ``operator_state`` (a number) and
    drop ``dropped``'s entry of it."""
    def change(entries: list[Entry]) -> list[Entry]:
        out = []
        for kg, name, key, value in entries:
            if name == operator_state and key == dropped:
                continue
            if name == operator_state and key == changed:
                value = value + 1
            out.append((kg, name, key, value))
        return out
    return change
