"""exec_shell_command and get_info on the host: caps, timeouts, streaming, killing on cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

from conftest import call
from llama_tools.builtin import BUILTIN_TOOLS, make_io
from llama_tools.builtin.shell import MAX_OUTPUT


def test_output_exit_code_and_cwd(tmp_path):
    res = call("exec_shell_command", {"command": "pwd; echo oops >&2; exit 3"}, cwd=str(tmp_path))
    assert res == {"plain_text_response": f"{tmp_path}\noops\n\n[exit code: 3]"}
    call("exec_shell_command", {"command": "echo hi > marker.txt"}, cwd=str(tmp_path))
    assert (tmp_path / "marker.txt").read_text() == "hi\n"
    # stdin is closed: a command that reads it does not wait
    assert (
        call("exec_shell_command", {"command": "cat; echo done"})["plain_text_response"]
        == "done\n\n[exit code: 0]"
    )


def test_output_cap_cannot_be_raised():
    res = call("exec_shell_command", {"command": "yes | head -c 100000", "max_output_size": 10**9})
    text = res["plain_text_response"]
    assert text.endswith("\n[output truncated]\n[exit code: 0]")
    assert len(text.split("\n[output truncated]")[0]) == MAX_OUTPUT
    res = call("exec_shell_command", {"command": "echo 123456789", "max_output_size": 4})
    assert res["plain_text_response"] == "1234\n[output truncated]\n[exit code: 0]"


def test_timeout_kills_the_process_group(tmp_path):
    start = time.monotonic()
    res = call(
        "exec_shell_command", {"command": f"sleep 30 & echo $! > {tmp_path}/pid; sleep 30", "timeout": 1}
    )
    assert time.monotonic() - start < 5
    assert res["plain_text_response"].endswith("[exit code: -9] [exit due to timed out]")
    pid = int((tmp_path / "pid").read_text())
    time.sleep(0.2)
    assert not _alive(pid), "the background job survived the timeout"


def test_huge_and_negative_timeouts_are_clamped():
    args = BUILTIN_TOOLS["exec_shell_command"].arguments({"command": "true", "timeout": 10**12})
    assert args["timeout"] == 10**12  # clamped where it is used: the run below would hang otherwise
    assert call("exec_shell_command", {"command": "echo ok", "timeout": -5})[
        "plain_text_response"
    ].startswith("ok")
    assert call("exec_shell_command", {"command": "echo ok", "timeout": "x"})[
        "plain_text_response"
    ].startswith("ok")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_stream_chunks_and_cancellation(tmp_path):
    tool = BUILTIN_TOOLS["exec_shell_command"]

    async def streamed():
        chunks: list[str] = []

        async def on_chunk(text: str) -> None:
            chunks.append(text)

        await tool.run(tool.arguments({"command": "echo a; echo b"}), make_io("", ""), on_chunk)
        return "".join(chunks)

    assert asyncio.run(streamed()) == "a\nb\n\n[exit code: 0]"

    async def cancelled():
        args = tool.arguments({"command": f"echo $$ > {tmp_path}/pid; sleep 30", "timeout": 60})
        task = asyncio.ensure_future(tool.run(args, make_io("", ""), None))
        while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text().strip():
            await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    start = time.monotonic()
    asyncio.run(cancelled())
    assert time.monotonic() - start < 5
    time.sleep(0.2)
    assert not _alive(int((tmp_path / "pid").read_text()))


def test_bad_cwd_is_a_result_not_a_crash(tmp_path):
    res = call("exec_shell_command", {"command": "echo hi"}, cwd=str(tmp_path / "missing"))
    assert res["plain_text_response"].endswith("[exit code: 127]")


def test_get_info(tmp_path):
    info = call("get_info", {})
    assert info["cwd"] == os.getcwd() and info["os"].startswith(os.uname().sysname)
    assert call("get_info", {"cwd": str(tmp_path)})["cwd"] == str(tmp_path)
