"""Deliberate damage to a checkpoint that still *verifies*: the state file is
rewritten in the keyed-state format and the metadata re-signed, as a bug in
the runtime (not a torn write) would leave it. Validation must see it."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

from eddyflow.checkpoint.layout import METADATA
from eddyflow.checkpoint.storage import CheckpointStorage, FileHandle, _checksum_of
from eddyflow.offline.checkpoint import keyed_files, open_checkpoint, read_keyed_file
from eddyflow.state.format import encode_frames

Entry = tuple[int, str, Any, Any]  # key group, state, key, value


def rewrite_state(chk: str, operator: str,
                  change: Callable[[list[Entry]], list[Entry]]) -> None:
    """Replace ``operator``'s keyed state in checkpoint folder ``chk`` by
    ``change(entries)``, subtask by subtask (each subtask's chain becomes
    one full file), keeping the checkpoint valid."""
    ref = open_checkpoint(chk)
    meta = CheckpointStorage(ref.root).read_metadata(ref.id)  # the JSON, to edit
    for kf in keyed_files(ref, operator):
        entries = change(list(read_keyed_file(kf)))
        groups: dict[int, list[tuple[str, list[Any], list[Any], list[Any]]]] = {}
        for kg, name, key, value in entries:
            cols = groups.setdefault(kg, [])
            if not cols or cols[-1][0] != name:
                cols.append((name, [], [], []))
            cols[-1][1].append(key)
            cols[-1][2].append(value)
        chunks, index = encode_frames(groups)
        data = b"".join(chunks)
        rel = f"chk-{ref.id}/{operator}-{kf.subtask}-tampered"
        with open(os.path.join(ref.root, rel), "wb") as f:
            f.write(data)
        handle = {"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        part = meta["operators"][operator]["subtasks"][str(kf.subtask)]["keyed"]
        part.update(files=[{**handle, "index": {k: list(v) for k, v in index.items()},
                            "full": True}], entries=len(entries))
        old = {f.path for f in kf.handle.file_handles()}
        meta["files"] = [f for f in meta["files"] if f["path"] not in old] + [handle]
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


def garble_state_file(chk: str, operator: str) -> str:
    """Overwrite the frames of ``operator``'s first keyed-state file in
    checkpoint folder ``chk`` with bytes that do not unpickle, and re-sign
    the metadata with the file's new size and checksum: the checkpoint
    *verifies* (on the driver), but an executor cannot read the file.
    Returns the file's path."""
    ref = open_checkpoint(chk)
    meta = CheckpointStorage(ref.root).read_metadata(ref.id)
    kf = keyed_files(ref, operator)[0]
    rel = kf.handle.file_handles()[0].path
    path = os.path.join(ref.root, rel)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[8:] = b"\x00" * (len(data) - 8)  # the first frame's length kept, its pickle gone
    with open(path, "wb") as f:
        f.write(data)
    sha = hashlib.sha256(bytes(data)).hexdigest()

    def resign(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("path") == rel:
                node.update(size=len(data), sha256=sha)
            for v in node.values():
                resign(v)
        elif isinstance(node, list):
            for v in node:
                resign(v)

    resign(meta)
    meta["checksum"] = _checksum_of(meta)
    with open(os.path.join(ref.path, METADATA), "w") as f:
        json.dump(meta, f)
    return path


def rewrite_channel_state(chk: str, change: Callable[[list[Any]], list[Any]]) -> int:
    """Replace every channel-state file of checkpoint folder ``chk`` by one
    whose records are ``change(records)`` for each logged batch, keeping
    the checkpoint valid (sizes and checksums re-signed). Returns how many
    files were rewritten."""
    from eddyflow.runtime.checkpointing.backedge_log import encode_batch, encode_logged_channels
    from eddyflow.runtime.checkpointing.channel_state import read_channel_state

    ref = open_checkpoint(chk)
    meta = CheckpointStorage(ref.root).read_metadata(ref.id)
    rewritten = 0
    for op in meta["operators"].values():
        for part in op["subtasks"].values():
            cs = part.get("channel_state")
            if not cs:
                continue
            old = cs["file"]["path"]
            inputs, outputs = read_channel_state(ref.root, FileHandle.from_json(cs["file"]))
            channels: dict[str, list[bytes]] = {}
            for side, parts in (("in", inputs), ("out", outputs)):
                for key, batches in parts.items():
                    channels[f"{side}/{key}"] = [
                        encode_batch(change(list(records)), None) for records, _ in batches]
            data = encode_logged_channels(channels)
            rel = old + "-tampered"
            with open(os.path.join(ref.root, rel), "wb") as f:
                f.write(data)
            handle = {"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            cs["file"] = handle
            meta["files"] = [f for f in meta["files"] if f["path"] != old] + [handle]
            rewritten += 1
    meta["checksum"] = _checksum_of(meta)
    with open(os.path.join(ref.path, METADATA), "w") as f:
        json.dump(meta, f)
    return rewritten
