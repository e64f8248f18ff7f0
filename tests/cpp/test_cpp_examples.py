"""The project's own C++ examples (docs/examples/cpp: a prompt and a decoder that pull and push caches and blocks,
then switch roles), built with CMake's find_package(llm_datadist) against the installed library (default libstdc++
ABI), run as two processes through two daemons as docs/cpp.md runs them by hand: nothing relayed between them (their
stdin is closed), the decoder started first."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from pathlib import Path

import pytest

from tests.cpp import ROOT, cmake_project
from tests.harness import free_port

pytestmark = pytest.mark.integration


class Program:
    """A running example: its stdout read line by line, each wait with a deadline."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env={**os.environ, **env})
        self.lines: list[str] = []
        self._buf = b""

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        """The first line (from the start) containing ``text``; AssertionError with the output after ``timeout``."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            while True:
                for line in self.lines:
                    if text in line:
                        return line
                left = deadline - time.monotonic()
                assert left > 0, f"no {text!r} within {timeout}s:\n" + "\n".join(self.lines)
                if sel.select(left):
                    chunk = os.read(self.proc.stdout.fileno(), 65536)
                    assert chunk, f"exited before {text!r}:\n" + "\n".join(self.lines)
                    self._buf += chunk
                    *done, self._buf = self._buf.split(b"\n")
                    self.lines += [d.decode(errors="replace") for d in done]
        finally:
            sel.close()

    def finish(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def examples(cpp_install: Path, tmp_path_factory) -> Path:
    return cmake_project(ROOT / "docs" / "examples" / "cpp", tmp_path_factory.mktemp("cpp-examples"))


def test_prompt_and_decoder_pull_push_and_switch_roles(examples, daemon_factory) -> None:
    """Issue 44, trip 10: the by-hand run needed lines relayed between the two processes (a cache id, an address, a
    go-ahead); now each waits, bounded, for what the other does, with the command lines of docs/cpp.md."""
    dp, dd = daemon_factory.many("p", "d")
    prompt_at, decoder_at = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    decoder = Program([str(examples / "decoder"), prompt_at, decoder_at],   # a plain socket path, as Python takes it
                      {"DATADIST_DAEMON": dd.target.removeprefix("unix://")})
    prompt = None
    try:
        decoder.wait_for("RegisterKvCache success")   # it retries its link until the prompt listens
        prompt = Program([str(examples / "prompt"), prompt_at, decoder_at], {"DATADIST_DAEMON": dp.target})
        assert prompt.wait_for("cache_id = ").endswith("= 1")
        for step in ("PullKvCache success", "batch 0 holds the prompt's batch 1", "blocks 1, 2 hold the prompt's 2, 3",
                     "layer 1 of block 7 pulled, layer 0 untouched", "PushKvBlocks success", "PushKvCache success",
                     "UnlinkLlmClusters success", "SetRole(kPrompt) success"):
            decoder.wait_for(step)
        assert decoder.wait_for("cache_id = ").endswith("= 1")
        for step in ("PushKvBlocks arrived", "PushKvCache arrived", "SetRole(kDecoder) success",
                     "block 0 holds the decoder's block 7", "Prompt end"):
            prompt.wait_for(step)
        decoder.wait_for("the prompt pulled our block 7 and pushed it back")
        decoder.wait_for("Decoder end")
        assert prompt.finish() == 0 and decoder.finish() == 0
        assert not [line for line in prompt.lines + decoder.lines if "[ERROR]" in line]
    finally:
        for p in (prompt, decoder):
            if p is not None and p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()


def test_the_by_hand_commands_are_the_ones_tested() -> None:
    """docs/cpp.md's by-hand run starts the two programs with the arguments the test above gives them."""
    doc = (ROOT / "docs" / "cpp.md").read_text()
    assert "build/cpp/examples/prompt 127.0.0.1:26000 127.0.0.1:26001" in doc
    assert "build/cpp/examples/decoder 127.0.0.1:26000 127.0.0.1:26001" in doc
