"""The checkpoint writer process (``eddyflow.checkpoint.writer``) and its helper
(``eddyflow.checkpoint.writer_main``): durable, atomic writes with the right
size and checksum; failures reported, not fatal to the helper; a cancelled
caller still waits for its write to land; a dead helper is an error, not a
hang; an orphaned helper writes nothing."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import anyio
import pytest

from eddyflow.checkpoint import writer_main
from eddyflow.checkpoint.storage import CheckpointStorage, FileHandle
from eddyflow.checkpoint.writer import FileWrite, WriterProcess
from eddyflow.checkpoint.writer_main import encode_request


async def _started() -> WriterProcess:
    w = WriterProcess()
    await w.start()
    return w


def test_write_is_durable_atomic_and_checksummed(tmp_path: Path) -> None:
    async def go() -> None:
        w = await _started()
        try:
            data = os.urandom(200_000)
            path = tmp_path / "chk-1" / "op-0" / "keyed-state"
            size, sha = await w.write(str(path), data, sync_after=[str(tmp_path)])
            assert (size, sha) == (len(data), hashlib.sha256(data).hexdigest())
            assert path.read_bytes() == data
            assert os.listdir(path.parent) == ["keyed-state"]  # no temporary left
            # Overwrites replace the whole file.
            await w.write(str(path), b"x")
            assert path.read_bytes() == b"x"
        finally:
            await w.aclose()

    anyio.run(go)


def test_concurrent_writes_each_get_their_own_answer(tmp_path: Path) -> None:
    results: dict[int, tuple[int, str]] = {}

    async def go() -> None:
        w = await _started()
        try:
            async def one(i: int) -> None:
                results[i] = await w.write(str(tmp_path / f"f{i}"), bytes([i]) * (i * 1000 + 1))

            async with anyio.create_task_group() as tg:
                for i in range(20):
                    tg.start_soon(one, i)
        finally:
            await w.aclose()

    anyio.run(go)
    for i in range(20):
        data = bytes([i]) * (i * 1000 + 1)
        assert results[i] == (len(data), hashlib.sha256(data).hexdigest())
        assert (tmp_path / f"f{i}").read_bytes() == data


def test_a_failed_write_raises_oserror_and_the_helper_goes_on(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")

    async def go() -> None:
        w = await _started()
        try:
            with pytest.raises(OSError) as info:
                await w.write(str(tmp_path / "file" / "below"), b"data")
            assert info.value.errno is not None
            assert "file" in str(info.value)
            await w.write(str(tmp_path / "ok"), b"fine")
        finally:
            await w.aclose()

    anyio.run(go)
    assert (tmp_path / "ok").read_bytes() == b"fine"


def test_a_batch_writes_in_order_in_one_round_trip_and_stops_at_a_failure(
        tmp_path: Path) -> None:
    """A batch's files are each written durably, in order, with their own
    size and checksum; a failure raises and leaves the files after it
    unwritten (a commit record never lands without the metadata before it)."""
    (tmp_path / "file").write_text("not a folder")
    first, second = os.urandom(3000), b"{}"

    async def go() -> None:
        w = await _started()
        try:
            got = await w.write_batch([
                FileWrite(str(tmp_path / "chk-1" / "_metadata"), first,
                          sync_after=[str(tmp_path / "chk-1"), str(tmp_path)]),
                FileWrite(str(tmp_path / "_commits" / "chk-1.json"), second,
                          sync_after=[str(tmp_path / "_commits")])])
            assert got == [(len(d), hashlib.sha256(d).hexdigest()) for d in (first, second)]
            with pytest.raises(OSError) as info:
                await w.write_batch([FileWrite(str(tmp_path / "file" / "below"), b"x"),
                                     FileWrite(str(tmp_path / "after"), b"y")])
            assert info.value.errno is not None
            assert await w.write_batch([]) == []
        finally:
            await w.aclose()

    anyio.run(go)
    assert (tmp_path / "chk-1" / "_metadata").read_bytes() == first
    assert (tmp_path / "_commits" / "chk-1.json").read_bytes() == second
    assert not (tmp_path / "after").exists()
    assert sorted(os.listdir(tmp_path)) == ["_commits", "chk-1", "file"]  # no temporaries


def test_a_started_write_is_under_way_before_it_is_awaited(tmp_path: Path) -> None:
    """``start_write`` and ``CheckpointStorage.start_write_file`` send the
    request at once: the files land while the caller has not awaited yet,
    and each awaited answer is its own file's (size, checksum, handle)."""
    storage = CheckpointStorage(tmp_path)
    one, two = os.urandom(5000), os.urandom(7000)

    async def go() -> None:
        w = await _started()
        storage.writer = w
        try:
            first = w.start_write(str(tmp_path / "one"), one)
            second = storage.start_write_file("chk-1/op-0/two", [two[:10], two[10:]])
            landed = False
            for _ in range(1000):  # up to 10 s: a hang guard, not a timing bound
                landed = ((tmp_path / "one").exists()
                          and (tmp_path / "chk-1" / "op-0" / "two").exists())
                if landed:
                    break
                await anyio.sleep(0.01)
            assert landed
            # Awaited in the other order than sent.
            handle = await second
            assert handle == FileHandle("chk-1/op-0/two", len(two),
                                        hashlib.sha256(two).hexdigest())
            assert await first == (len(one), hashlib.sha256(one).hexdigest())
        finally:
            storage.writer = None
            await w.aclose()

    anyio.run(go)
    assert (tmp_path / "one").read_bytes() == one
    assert (tmp_path / "chk-1" / "op-0" / "two").read_bytes() == two


def test_remove_deletes_the_marker_first_then_the_tree(tmp_path: Path) -> None:
    folder = tmp_path / "chk-3"
    (folder / "op-0").mkdir(parents=True)
    (folder / "op-0" / "keyed-state").write_bytes(b"s")
    (folder / "_metadata").write_text("{}")

    async def go() -> None:
        w = await _started()
        try:
            await w.remove(str(folder), str(folder / "_metadata"))
            await w.remove(str(tmp_path / "absent"), str(tmp_path / "absent" / "_metadata"))
        finally:
            await w.aclose()

    anyio.run(go)
    assert not folder.exists()


def test_a_cancelled_caller_waits_for_its_write_to_land(tmp_path: Path) -> None:
    data = os.urandom(30 << 20)
    path = tmp_path / "big"

    async def go() -> None:
        w = await _started()
        try:
            with anyio.move_on_after(0.001) as scope:
                await w.write(str(path), data)
            assert scope.cancelled_caught or path.exists()
            # Back from the cancelled call: the write has landed, whole.
            assert path.stat().st_size == len(data)
        finally:
            await w.aclose()

    anyio.run(go)


def test_a_dead_helper_is_an_error_not_a_hang(tmp_path: Path) -> None:
    async def go() -> None:
        w = await _started()
        try:
            await w.write(str(tmp_path / "a"), b"a")
            assert w._transport is not None and w._answers is not None
            w._transport.kill()
            await w._answers.exited.wait()
            with anyio.fail_after(10), pytest.raises(OSError, match="writer process is gone"):
                await w.write(str(tmp_path / "b"), b"b")
            assert not w.running
        finally:
            await w.aclose()

    anyio.run(go)


def test_storage_writes_through_the_helper_and_verifies_on_read(tmp_path: Path) -> None:
    storage = CheckpointStorage(tmp_path)

    async def go() -> None:
        storage.writer = await _started()
        try:
            handle = await storage.write_file("chk-1/op-0/keyed-state", [b"ab", b"cd"])
            await storage.write_metadata(1, {"files": [handle.to_json()]})
        finally:
            await storage.writer.aclose()
            storage.writer = None

    anyio.run(go)
    meta = storage.verify(1)  # the metadata's checksum, and each file's size and SHA-256
    assert storage.read_verified(FileHandle.from_json(meta["files"][0])) == b"abcd"
    assert storage.latest_valid() is not None


def test_an_orphaned_helper_writes_nothing(tmp_path: Path) -> None:
    # The helper was started by a process that is no longer its parent (the
    # job was killed): it must not write into a folder a new run may use.
    request = encode_request({"id": 1, "op": "write", "path": str(tmp_path / "f")}, b"x")
    requests = io.BytesIO(request)
    answers = io.BytesIO()
    writer_main.serve(requests, answers, parent=os.getppid() + 1_000_000)
    assert not (tmp_path / "f").exists()
    assert answers.getvalue() == b""


def test_the_helper_answers_in_order_and_reports_unknown_operations(tmp_path: Path) -> None:
    requests = io.BytesIO(
        encode_request({"id": 7, "op": "write", "path": str(tmp_path / "f")}, b"hello")
        + encode_request({"id": 8, "op": "frobnicate"}))
    answers = io.BytesIO()
    writer_main.serve(requests, answers, parent=0)
    first, second = (json.loads(line) for line in answers.getvalue().splitlines())
    assert first == {"id": 7, "ok": True, "size": 5,
                     "sha256": hashlib.sha256(b"hello").hexdigest()}
    assert second["id"] == 8 and not second["ok"] and "frobnicate" in second["error"]



def test_an_orphaned_writer_process_exits_quietly(tmp_path: Path) -> None:
    """Its job was killed: the answer finds no reader. No traceback."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-I", "-S", writer_main.__file__],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdout.close()  # the job is gone
    request = writer_main.encode_request(
        {"id": 1, "op": "write", "path": str(tmp_path / "f"), "size": 3}, b"abc")
    proc.stdin.write(request * 50)
    proc.stdin.close()
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert proc.wait(timeout=30) == 0
    assert err == b"", err.decode()


def test_seal_makes_a_file_written_elsewhere_durable_with_its_checksum(tmp_path: Path) -> None:
    """A file the job streamed to a temporary name is sealed by the helper
    (checksum read back, fsync, rename), or in-process without one."""
    data = os.urandom(3_000_000)

    async def go() -> None:
        w = await _started()
        try:
            storage = CheckpointStorage(tmp_path)
            storage.writer = w
            for rel in ("shared/by-helper", "shared/other"):
                tmp, out = storage.open_temp(rel)
                with out:
                    out.write(data)
                if rel == "shared/other":
                    storage.writer = None  # in-process, off the loop
                handle = await storage.seal(rel, tmp)
                assert handle == FileHandle(rel, len(data), hashlib.sha256(data).hexdigest())
                assert (tmp_path / rel).read_bytes() == data
                storage.verify_file(handle)
            assert sorted(os.listdir(tmp_path / "shared")) == ["by-helper", "other"]
            with pytest.raises(OSError, match="missing"):
                await w.seal(str(tmp_path / "missing"), str(tmp_path / "shared" / "x"))
            assert w.running  # a failed request does not stop the helper
        finally:
            await w.aclose()

    anyio.run(go)


def test_the_helper_widens_its_request_pipe(tmp_path: Path) -> None:
    fcntl = pytest.importorskip("fcntl")
    getsize = getattr(fcntl, "F_GETPIPE_SZ", None)
    if getsize is None:
        pytest.skip("no F_GETPIPE_SZ here")
    probe_r, probe_w = os.pipe()
    try:
        fcntl.fcntl(probe_w, fcntl.F_SETPIPE_SZ, writer_main.PIPE_SIZE)
    except OSError:
        pytest.skip("this machine refuses pipes of that size")
    finally:
        os.close(probe_r)
        os.close(probe_w)
    r, w = os.pipe()
    try:
        assert fcntl.fcntl(w, getsize) < writer_main.PIPE_SIZE
        writer_main._widen_pipe(r)  # the reader's end: the helper's stdin
        assert fcntl.fcntl(w, getsize) == writer_main.PIPE_SIZE
    finally:
        os.close(r)
        os.close(w)


def test_a_failed_durable_write_or_seal_leaves_no_temporary(tmp_path: Path) -> None:
    """Whether the helper or the job wrote the temporary file, a failure
    before the rename removes it and reports the error."""
    target = tmp_path / "taken"
    (target / "inside").mkdir(parents=True)  # a folder: nothing can be renamed over it
    tmp = writer_main.temp_name(str(target))
    with open(tmp, "wb") as f:
        f.write(b"streamed")
    with pytest.raises(OSError):
        writer_main.seal_durably(tmp, str(target))
    with pytest.raises(OSError):
        writer_main.write_durably(str(target), [b"written"])
    assert sorted(os.listdir(tmp_path)) == ["taken"]
